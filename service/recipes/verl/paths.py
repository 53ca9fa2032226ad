"""Where the paths of a composed verl config may point, checked after composition.

The checkpoint dir stays under the run's own ``<root>/<run id>``; no path has ``..``; every other
path a spec sets is relative (the run's files, a hub id), under the run's own dir or under an
operator's data root (``RLRUN_VERL_DATA_DIR``, ``RLRUN_VERL_MODEL_DIR``, ``RLRUN_DATA_ROOTS``),
and never in another run's checkpoints. A deployment widens this by settings
(``RLRUN_DATA_ROOTS``), never a request.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from service.errors import field_error
from service.recipes.verl.hydra_check import select as cfg_select

CHECKPOINT_KEY = "trainer.default_local_dir"
# Where verl writes: the checkpoints always, the rollout and validation dumps when set.
OUTPUT_KEYS = (CHECKPOINT_KEY, "trainer.rollout_data_dir", "trainer.validation_data_dir")
PATH_NAME = re.compile(r"(^|_)(dir|path|paths|file|files)$")


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


def read_paths(
    cfg: dict[str, Any], checkpoint_dir: str, set_by_spec: Callable[[str], bool]
) -> list[str]:
    """The absolute paths and URIs the spec (``set_by_spec``) has the run read outside its own
    dir: what the nodes of the cluster it goes to must hold (a cluster's ``data_roots``)."""
    own = posixpath.normpath(checkpoint_dir)
    found = {
        value
        for key, value in _pathlike_values(cfg, "")
        if set_by_spec(key)
        and ((value.startswith("/") and not _inside(value, own)) or URI.match(value))
    }
    return sorted(found)


def under_roots(path: str, roots: Sequence[str]) -> bool:
    """Whether ``path`` (absolute, or a URI) is under one of ``roots``."""
    if URI.match(path):
        return any(_under_uri(path, root) for root in roots if URI.match(root))
    return any(_inside(path, root) for root in roots if root.startswith("/"))


def _pathlike_values(node: Any, prefix: str) -> Iterator[tuple[str, str]]:
    """(dotted key, value) of every string that is a path: under a key named like a path, dir
    or file, or absolute (``/``, ``~``) or a URI under any key."""
    for key, named, item in _strings(node, prefix):
        if named or item.startswith(("/", "~")) or URI.match(item) is not None:
            yield key, item


def _path_values(node: Any, prefix: str) -> Iterator[tuple[str, str]]:
    """(dotted key, value) of every string under a key named like a path, dir or file."""
    for key, named, item in _strings(node, prefix):
        if named:
            yield key, item


def _strings(node: Any, prefix: str) -> Iterator[tuple[str, bool, str]]:
    """(dotted key, whether the key is named like a path, value) of every string in ``node``,
    alone or in a list."""
    if not isinstance(node, dict):
        return
    for k, v in node.items():
        key = f"{prefix}.{k}" if prefix else str(k)
        if isinstance(v, dict):
            yield from _strings(v, key)
            continue
        named = PATH_NAME.search(str(k)) is not None
        for item in v if isinstance(v, list) else [v]:
            if isinstance(item, str):
                yield key, named, item


def _inside(path: str, root: str) -> bool:
    if not path.startswith("/") or ".." in path.split("/"):
        return False
    norm = posixpath.normpath(path)
    return norm == root or norm.startswith(root.rstrip("/") + "/")
