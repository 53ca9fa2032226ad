"""The verl versions a spec may name: the installed one (the default) and wheels in a cache.

``rlrun verl add X`` downloads verl X's wheel without its dependencies (pip, from the package
index) and unpacks its ``verl/`` package and metadata into ``<cache>/<X>/``. A spec naming
``verl_version: X`` is then composed against that tree's Hydra YAML and its dataclass sources,
never imported; the preflight checks the nodes carry X.
"""

from __future__ import annotations

import email.parser
import functools
import importlib.metadata
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from service.errors import InvalidSpec, field_error
from service.recipes.verl import typed_keys
from service.recipes.verl.hydra_check import FULLY_ASYNC_CONFIG, verl_root

VERSION = re.compile(r"^\d+\.\d+\.\d+(?:(?:rc|\.post|\.dev)\d+)?$")


def _usable(root: Path) -> bool:
    return (root / FULLY_ASYNC_CONFIG / "fully_async_ppo_trainer.yaml").is_file()


def installed() -> str:
    return typed_keys.version(verl_root())


def cached(cache_dir: Path) -> dict[str, Path]:
    """Version -> the unpacked ``verl`` package of each usable wheel in the cache."""
    if not cache_dir.is_dir():
        return {}
    return {
        d.name: d / "verl"
        for d in sorted(cache_dir.iterdir())
        if VERSION.match(d.name) and _usable(d / "verl")
    }


def root_for(version: str | None, cache_dir: Path) -> tuple[str, Path | None]:
    """The version a spec is checked against and its tree (None: the installed verl)."""
    default = installed()
    if version is None or version == default:
        return default, None
    found = cached(cache_dir)
    if version not in found:
        known = ", ".join(sorted({default, *found}))
        msg = (
            f"verl {version} is not available to validate against (known: {known}); "
            f"add it with `rlrun verl add {version}`"
        )
        raise InvalidSpec(msg, [field_error(["verl_version"], msg, "unknown_verl_version")])
    return version, found[version]


def requires(root: Path | None) -> list[str]:
    """The Requires-Dist lines of that verl's wheel."""
    return list(_requires(root))


@functools.lru_cache(maxsize=16)
def _requires(root: Path | None) -> tuple[str, ...]:
    # A version's tree never changes once unpacked (nor the installed one while this runs).
    return tuple(_read_requires(root))


def _read_requires(root: Path | None) -> list[str]:
    if root is None:
        return importlib.metadata.requires("verl") or []
    for meta in root.parent.glob("verl-*.dist-info/METADATA"):
        parsed = email.parser.Parser().parsestr(meta.read_text(encoding="utf-8"))
        return parsed.get_all("Requires-Dist") or []
    return []


def add(version: str, cache_dir: Path) -> Path:
    """Download verl ``version``'s wheel (no dependencies) and unpack it into the cache."""
    if not VERSION.match(version):
        raise ValueError(f"{version!r} is not a verl release version")
    target = cache_dir / version
    if _usable(target / "verl"):
        return target / "verl"
    with tempfile.TemporaryDirectory() as tmp:
        try:
            subprocess.run(
                [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                 "--only-binary=:all:", f"verl=={version}", "--dest", tmp],
                check=True, timeout=600,
            )  # fmt: skip
        except subprocess.SubprocessError as exc:
            raise ValueError(f"pip could not download verl=={version}: {exc}") from exc
        (wheel,) = Path(tmp).glob("verl-*.whl")
        with zipfile.ZipFile(wheel) as zf:
            members = [
                n for n in zf.namelist() if n.startswith("verl/") or ".dist-info/METADATA" in n
            ]
            zf.extractall(target, members)
    if not _usable(target / "verl"):
        raise ValueError(f"verl {version} does not ship the fully async config")
    return target / "verl"
