"""Where a run's files land on the cluster, and the overrides that name them.

A spec's ``files`` are unpacked in ``RUN_FILES_DIR`` of the job's working directory, never at
its top: the working directory is the job's current directory and Ray puts it on every
process's ``PYTHONPATH``, so a file at its top named ``sitecustomize.py``, ``jobs.py``,
``ray.py`` or ``verl.py`` would run before (or instead of) the launcher and verl. The
subdirectory is on no path, and its name is no Python identifier, so nothing imports it as a
package. An override that names a shipped file by its name (a key named like a path, dir or
file, e.g. ``custom_reward_function.path=reward.py``) is rewritten to the file's place there.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping
from typing import Any

from service.recipes.base import RUN_FILES_DIR
from service.recipes.verl.command import hydra_value
from service.recipes.verl.overrides import Override
from service.recipes.verl.paths import PATH_NAME


def place(name: str) -> str:
    """Where the shipped file ``name`` is, relative to the job's working directory."""
    return f"{RUN_FILES_DIR}/{name}"


def _moved(value: Any, files: Mapping[str, str]) -> Any:
    if isinstance(value, str) and posixpath.normpath(value) in files:
        return place(posixpath.normpath(value))
    if isinstance(value, list):
        return [_moved(v, files) for v in value]
    return value


def rewrite(overrides: list[Override], files: Mapping[str, str]) -> list[Override]:
    """``overrides`` with each path value naming a shipped file pointed at its place."""
    if not files:
        return overrides
    out = []
    for o in overrides:
        p = o.parsed
        if p is None or p.group or p.kind == "~" or not PATH_NAME.search(p.key.rsplit(".")[-1]):
            out.append(o)  # a syntax error is left to the composition, naming the field
            continue
        value = _moved(p.value, files)
        if value == p.value:
            out.append(o)
        else:
            out.append(o.rewritten(f"{p.kind}{p.key}={hydra_value(value, o.loc)}", value))
    return out


def places(files: Mapping[str, str]) -> set[str]:
    """Where the shipped files are, relative to the job's working directory."""
    return {place(name) for name in files}
