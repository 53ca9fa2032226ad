"""The verl versions a spec may name: the installed one (the default) and wheels in a cache.

``rlrun verl add X`` downloads verl X's wheel without its dependencies (pip, from the package
index, held to the SHA-256 digests the index's JSON API publishes for X) and unpacks its
``verl/`` package and metadata into ``<cache>/<X>/``. A spec naming ``verl_version: X`` is then
composed against that tree's Hydra YAML and its dataclass sources, never imported; the
preflight checks the nodes carry X.
"""

from __future__ import annotations

import email.parser
import functools
import hashlib
import importlib.metadata
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import httpx
from packaging.version import InvalidVersion, Version

from service.errors import InvalidSpec, field_error
from service.recipes.verl import typed_keys
from service.recipes.verl.hydra_check import FULLY_ASYNC_CONFIG, verl_root

# A release as the index names it (ASCII digits; matched whole, so no trailing newline).
VERSION = re.compile(r"[0-9]+\.[0-9]+\.[0-9]+(?:(?:rc|\.post|\.dev)[0-9]+)?")
PYPI_JSON = "https://pypi.org/pypi"


def is_release(text: str) -> bool:
    """A strict PEP 440 release (pre, post and dev releases too), in its canonical form."""
    if not isinstance(text, str) or not VERSION.fullmatch(text):
        return False
    try:
        return str(Version(text)) == text
    except InvalidVersion:
        return False


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
        if is_release(d.name) and _usable(d / "verl")
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


def add(version: str, cache_dir: Path, index_json: str = PYPI_JSON) -> Path:
    """Download verl ``version``'s wheel (no dependencies) and unpack it into the cache, once
    its SHA-256 is one the index's JSON API publishes for that release (pip is held to those
    hashes, and the file is checked again before it is opened)."""
    if not is_release(version):
        raise ValueError(f"{version!r} is not a verl release version (e.g. 0.9.0)")
    target = cache_dir / version
    if _usable(target / "verl"):
        return target / "verl"
    digests = published_digests(version, index_json)
    with tempfile.TemporaryDirectory() as tmp:
        requirement = Path(tmp) / "requirement.txt"
        hashes = " ".join(f"--hash=sha256:{d}" for d in sorted(digests.values()))
        requirement.write_text(f"verl=={version} {hashes}\n")
        dest = Path(tmp) / "wheel"
        try:
            subprocess.run(
                [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                 "--require-hashes", "--only-binary=:all:", "-r", str(requirement),
                 "--dest", str(dest)],
                check=True, timeout=600,
            )  # fmt: skip
        except subprocess.SubprocessError as exc:
            raise ValueError(f"pip could not download verl=={version}: {exc}") from exc
        (wheel,) = dest.glob("verl-*.whl")
        if digests.get(wheel.name) != _sha256(wheel):
            raise ValueError(f"{wheel.name} does not have the SHA-256 the index publishes")
        with zipfile.ZipFile(wheel) as zf:
            members = [
                n for n in zf.namelist() if n.startswith("verl/") or ".dist-info/METADATA" in n
            ]
            zf.extractall(target, members)
    if not _usable(target / "verl"):
        raise ValueError(f"verl {version} does not ship the fully async config")
    return target / "verl"


def published_digests(version: str, index_json: str) -> dict[str, str]:
    """Wheel file name -> SHA-256, as the index's JSON API lists them for verl ``version``."""
    url = f"{index_json.rstrip('/')}/verl/json"  # the project's page: every release's files
    try:
        answer = httpx.get(url, timeout=30, follow_redirects=True)
        answer.raise_for_status()
        files = answer.json()["releases"][version]
        digests = {
            str(f["filename"]): str(f["digests"]["sha256"]).lower()
            for f in files
            if f.get("packagetype") == "bdist_wheel"
        }
    except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(
            f"the index lists no checked wheel of verl {version} ({url}): {exc}"
        ) from exc
    if not digests or not all(re.fullmatch(r"[0-9a-f]{64}", d) for d in digests.values()):
        raise ValueError(f"the index lists no wheel of verl {version} with a SHA-256 ({url})")
    return digests


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
