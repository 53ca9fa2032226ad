"""What a verl spec may ask of the cluster, checked before anything is composed or launched.

Overrides: config-group options only from verl's own config tree (no paths, no ``@package``
re-targeting), no interpolation (``${``), no ``_target_`` (object instantiation), nothing under
``ray_kwargs`` (``ray.init`` of the job's driver) or Hydra's own settings. pip: plain
``name[extras] specifiers`` requirements, matched whole. Env names: ``service.recipes.env_names``.
Paths: the checkpoint dir stays under the run's own ``<root>/<run id>``; no path has ``..``;
every other path a spec sets is relative (the run's files, a hub id), under the run's own dir or
under an operator's data root (``RLRUN_VERL_DATA_DIR``, ``RLRUN_VERL_MODEL_DIR``,
``RLRUN_DATA_ROOTS``), and never in another run's checkpoints. A deployment widens this by
settings (``RLRUN_OVERRIDE_ALLOW``, ``RLRUN_ENV_ALLOW``, ``RLRUN_DATA_ROOTS``), never a request.
"""

from __future__ import annotations

import functools
import posixpath
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement

from service.errors import field_error
from service.recipes import env_names
from service.recipes.verl.hydra_check import FULLY_ASYNC_CONFIG, TRAINER_CONFIG, verl_root
from service.recipes.verl.hydra_check import select as cfg_select
from service.recipes.verl.overrides import Override, read

DENIED_KEYS = ("ray_kwargs", "hydra")
VERSION = r"[A-Za-z0-9.*+!_-]+"
SPECIFIER = rf"(?:~=|===|==|!=|<=|>=|<|>) *{VERSION}"
PIP_REQUIREMENT = re.compile(
    r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?"
    r"(?: *\[ *[A-Za-z0-9][A-Za-z0-9._-]*(?: *, *[A-Za-z0-9][A-Za-z0-9._-]*)* *\])?"
    rf"(?: *{SPECIFIER}(?: *, *{SPECIFIER})*)?"
)
CHECKPOINT_KEY = "trainer.default_local_dir"
# Where verl writes: the checkpoints always, the rollout and validation dumps when set.
OUTPUT_KEYS = (CHECKPOINT_KEY, "trainer.rollout_data_dir", "trainer.validation_data_dir")
PATH_NAME = re.compile(r"(^|_)(dir|path|paths|file|files)$")


@functools.lru_cache(maxsize=1)
def config_groups() -> dict[str, frozenset[str]]:
    """verl's config groups (directory paths) and the option names (YAML files) in each."""
    root = verl_root()
    groups: dict[str, set[str]] = {}
    for base in (root / TRAINER_CONFIG, root / FULLY_ASYNC_CONFIG):
        for path in base.rglob("*.yaml"):
            group = path.parent.relative_to(base).as_posix()
            if group != "." and not any(p.startswith("_") for p in Path(group).parts):
                groups.setdefault(group, set()).add(path.stem)
    return {g: frozenset(options) for g, options in groups.items()}


def _strings_and_keys(value: Any) -> Iterator[str]:
    if isinstance(value, dict):
        for k, v in value.items():
            yield str(k)
            yield from _strings_and_keys(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings_and_keys(v)
    elif isinstance(value, str):
        yield value


def _under(key: str, prefix: str) -> bool:
    return key == prefix or key.startswith(prefix + ".") or key.startswith(prefix + "/")


def override_refusal(text: str, allow: Sequence[str] = ()) -> str | None:
    """Why one override string may not pass, or None (``refusal`` of it parsed)."""
    return refusal(read(text, ("overrides",)), allow)


def refusal(o: Override, allow: Sequence[str] = ()) -> str | None:
    """Why one override may not pass, or None. Messages name the key, never a composed value."""
    if "${" in o.text:
        return "interpolations ('${') are not allowed in overrides"
    p = o.parsed
    if p is None:
        return None  # a syntax error: composition reports it with Hydra's parser message
    allowed = any(_under(p.key, a) for a in allow)
    if any(part == "_target_" for part in re.split(r"[./]", p.key)):
        return "_target_ (object instantiation) may not be overridden"
    for s in _strings_and_keys(p.value):
        if "${" in s:
            return "interpolations ('${') are not allowed in overrides"
        if s == "_target_":
            return "_target_ (object instantiation) may not be set"
    if not allowed:
        for denied in DENIED_KEYS:
            if _under(p.key, denied):
                return f"{denied} is fixed by the service and may not be overridden"
    if p.group:
        if p.package is not None:
            return "config-group overrides may not re-target a package ('@')"
        options = config_groups().get(p.key)
        if options is None:
            return f"{p.key!r} is not one of verl's config groups"
        if p.kind != "~" and not (isinstance(p.value, str) and p.value in options):
            return f"{p.key} takes one of verl's options: {', '.join(sorted(options))}"
    return None


def check_overrides(overrides: Sequence[Override], allow: Sequence[str]) -> list[dict[str, Any]]:
    """The spec's own overrides (parsed), each refused under its field."""
    return [
        field_error(o.loc, why, "forbidden_override")
        for o in overrides
        if (why := refusal(o, allow))
    ]


def pip_refusal(requirement: str) -> str | None:
    """Only ``name[extras] specifiers``: no options, paths, URLs or markers."""
    if not PIP_REQUIREMENT.fullmatch(requirement):
        return f"{requirement!r} is not a plain requirement name[extras] with version specifiers"
    try:
        Requirement(requirement)
    except InvalidRequirement:
        return f"{requirement!r} is not a valid requirement"
    return None


def check_runtime_env(
    env_vars: dict[str, str], pip: Sequence[str] | None, service_env: dict[str, str],
    allow: Sequence[str],
) -> list[dict[str, Any]]:  # fmt: skip
    errors = []
    for name in env_vars:
        why = env_names.refusal(name, allow)
        if why is None and name in service_env and env_vars[name] != service_env[name]:
            why = f"{name} is set by the service (to {service_env[name]!r})"
        if why:
            errors.append(field_error(["runtime_env", "env_vars", name], why, "forbidden_env"))
    for i, req in enumerate(pip or []):
        why = pip_refusal(req)
        if why:
            errors.append(field_error(["runtime_env", "pip", i], why, "forbidden_pip"))
    return errors


def check_paths(
    cfg: dict[str, Any],
    checkpoint_dir: str,
    where: Callable[[str], tuple[str | int, ...]],
    pins: PathPins | None = None,
    set_by_spec: Callable[[str], bool] | None = None,
) -> list[dict[str, Any]]:
    """On the composed config, so overrides are held to the same rules as spec fields: the
    checkpoint dir (and the dumps verl writes) stay in the run's own dir; no path climbs; and
    with ``pins``, every path the spec sets (``set_by_spec``) is relative (the run's working
    directory, or a hub id), under the run's own dir, or under a data root of the operator's,
    and never in another run's checkpoints."""
    errors, reported = [], set()
    own = posixpath.normpath(checkpoint_dir)
    for key in OUTPUT_KEYS:
        value = cfg_select(cfg, key)
        if (value is not None or key == CHECKPOINT_KEY) and not (
            isinstance(value, str) and _inside(value, own)
        ):
            msg = f"{key} must be {own} or under it (the run's own directory)"
            errors.append(field_error(where(key), msg, "forbidden_path"))
            reported.add(key)
    climbing = {key for key, value in _path_values(cfg, "") if ".." in re.split(r"[/\\]", value)}
    for key in sorted(climbing - reported):
        msg = f"{key}: '..' is not allowed in paths"
        errors.append(field_error(where(key), msg, "forbidden_path"))
        reported.add(key)
    if pins is None or set_by_spec is None:
        return errors
    for key, value in _pathlike_values(cfg, ""):
        if key in reported or not set_by_spec(key):
            continue
        why = pins.refusal(value, own)
        if why:
            errors.append(field_error(where(key), f"{key}: {why}", "forbidden_path"))
            reported.add(key)
    return errors


URI = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")


@dataclass(frozen=True)
class PathPins:
    """Where a spec's paths may point: ``data_roots`` (absolute dirs, or URI prefixes such as
    ``hdfs://namenode/datasets``) and, under ``checkpoint_root``, only the run's own dir."""

    checkpoint_root: str
    data_roots: tuple[str, ...]

    def refusal(self, path: str, own: str) -> str | None:
        roots = ", ".join(self.data_roots) or "none"
        if path.startswith("~"):
            return f"a home directory path is not pinned; give a path under a data root ({roots})"
        if URI.match(path):
            if any(_under_uri(path, root) for root in self.data_roots if URI.match(root)):
                return None
            return f"a URI must start with a data root ({roots})"
        if not path.startswith("/"):
            return None  # in the run's working directory (its files), or a hub id
        norm = posixpath.normpath(path)
        if _inside(norm, own):
            return None
        if _inside(norm, self.checkpoint_root):
            return "another run's checkpoints are not reachable; only the run's own directory"
        if any(_inside(norm, root) for root in self.data_roots if root.startswith("/")):
            return None
        return f"must be under the run's own directory or a data root ({roots})"


def _under_uri(path: str, root: str) -> bool:
    root = root.rstrip("/")
    return (path == root or path.startswith(root + "/")) and ".." not in path.split("/")


def _pathlike_values(node: Any, prefix: str) -> Iterator[tuple[str, str]]:
    """(dotted key, value) of every string that is a path: under a key named like a path, dir
    or file, or absolute (``/``, ``~``) or a URI under any key."""
    if not isinstance(node, dict):
        return
    for k, v in node.items():
        key = f"{prefix}.{k}" if prefix else str(k)
        if isinstance(v, dict):
            yield from _pathlike_values(v, key)
            continue
        named = PATH_NAME.search(str(k)) is not None
        for item in v if isinstance(v, list) else [v]:
            if isinstance(item, str) and (
                named or item.startswith(("/", "~")) or URI.match(item) is not None
            ):
                yield key, item


def _path_values(node: Any, prefix: str) -> Iterator[tuple[str, str]]:
    """(dotted key, value) of every string under a key named like a path, dir or file."""
    if not isinstance(node, dict):
        return
    for k, v in node.items():
        key = f"{prefix}.{k}" if prefix else str(k)
        if isinstance(v, dict):
            yield from _path_values(v, key)
        elif PATH_NAME.search(str(k)):
            for item in v if isinstance(v, list) else [v]:
                if isinstance(item, str):
                    yield key, item


def _inside(path: str, root: str) -> bool:
    if not path.startswith("/") or ".." in path.split("/"):
        return False
    norm = posixpath.normpath(path)
    return norm == root or norm.startswith(root.rstrip("/") + "/")
