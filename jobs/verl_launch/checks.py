"""What the preflight checks on one node: paths, devices and installed package versions.

Pure functions of the plan and the node's filesystem and package metadata; nothing heavy is
imported (package versions come from metadata, not from importing torch or vllm).
"""

from __future__ import annotations

import glob
import os
import platform
import tempfile
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from packaging.specifiers import InvalidSpecifier, SpecifierSet

from jobs.verl_launch import Plan, pairs

DEVICE_FILES = {"NPU": "/dev/davinci[0-9]*", "GPU": "/dev/nvidia[0-9]*"}


def _result(check: str, key: str, target: str, reason: str | None) -> dict[str, Any]:
    return {"check": check, "key": key, "target": target, "ok": reason is None, "reason": reason}


def _local(path: str) -> bool:
    """Absolute, or relative to the working directory (the run's shipped files): not a URI."""
    return "://" not in path


def readable_file(path: str) -> str | None:
    if not os.path.exists(path):
        return "does not exist"
    if os.path.isdir(path):
        return None if os.access(path, os.R_OK | os.X_OK) else "is a directory it cannot read"
    return None if os.access(path, os.R_OK) else "is not readable"


def readable_dir(path: str) -> str | None:
    if not os.path.exists(path):
        return "does not exist"
    if not os.path.isdir(path):
        return "is not a directory"
    return None if os.access(path, os.R_OK | os.X_OK) else "is not readable"


def writable(path: str) -> str | None:
    """The run creates ``path``: its nearest existing ancestor must take a new file."""
    probe = path
    while not os.path.exists(probe):
        probe = os.path.dirname(probe)
    if not os.path.isdir(probe):
        return f"{probe} is not a directory"
    try:
        with tempfile.NamedTemporaryFile(dir=probe, prefix=".rlrun-preflight-"):
            pass
    except OSError as exc:
        return f"cannot write in {probe}: {exc.strerror or exc}"
    return None


def package(name: str, spec: str) -> tuple[str, str | None]:
    try:
        have = version(name)
    except PackageNotFoundError:
        return "not installed", "is not installed"
    if not spec:
        return have, None
    try:
        wanted = SpecifierSet(spec)
    except InvalidSpecifier:
        return have, f"cannot read the requirement {spec!r}"
    # A local label (torch 2.10.0+cpu) is the same release as its public version.
    if wanted.contains(have.split("+", 1)[0], prereleases=True):
        return have, None
    return have, f"is {have}, the run was validated against {name}{spec}"


def devices(accelerator: str, declared: float) -> tuple[str, str | None]:
    found = len(glob.glob(DEVICE_FILES.get(accelerator, "/nonexistent")))
    target = f"{declared:g} {accelerator} in Ray, {found} device files"
    if found < declared:
        return target, f"Ray declares {declared:g} {accelerator} but the node has {found} devices"
    return target, None


def installed(names: list[str]) -> dict[str, str]:
    """Distribution -> installed version, for those of ``names`` that are installed."""
    out = {}
    for name in names:
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            continue
    return out


def stack(accelerator: str, cann_info: str = pairs.CANN_INFO) -> list[dict[str, Any]]:
    """One failed check for each known broken pair this node's packages (and CANN) meet."""
    have = installed(pairs.dists(accelerator))
    if accelerator == "npu":
        cann = pairs.cann_version(cann_info.format(arch=platform.machine()))
        if cann is not None:
            have[pairs.CANN] = cann
    return [
        _result(
            "pair",
            row.name,
            ", ".join(f"{d} {have[d]}" for d in row.when),
            f"is a stack pair known to break ({row.name}): {row.says()}",
        )
        for row in pairs.broken(accelerator, have)
    ]


def check_node(plan: Plan, declared: float) -> list[dict[str, Any]]:
    """Every check of ``plan`` on this node (``declared``: Ray's accelerator count here)."""
    out = []
    paths = (
        ("file", plan.get("files", []), readable_file),
        ("dir", plan.get("dirs", []), readable_dir),
        ("write", plan.get("writable", []), writable),
    )
    for kind, items, test in paths:
        for item in items:
            path = item["path"]
            reason = test(path) if _local(path) else None
            out.append(_result(kind, item["key"], path, reason))
    for name, spec in sorted(plan.get("packages", {}).items()):
        have, reason = package(name, spec)
        out.append(_result("package", name, have, reason))
    if plan.get("stack"):
        out += stack(plan["stack"])
    accelerator = plan.get("accelerator", "NPU")
    if declared > 0 and plan.get("check_devices", True):
        target, reason = devices(accelerator, declared)
        out.append(_result("devices", accelerator, target, reason))
    return out
