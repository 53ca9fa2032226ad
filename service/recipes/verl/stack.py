"""A spec's trainer stack against the pairs known to break (``jobs.verl_launch.pairs``), at submit.

The versions are the target image's pins for the spec's accelerator (``pairs.TESTED``), with
the verl the spec names (``verl_version``, else the service's) and any exact pin the deployment's
preflight requires (``RLRUN_PREFLIGHT_PACKAGES``). A known broken pair is a refusal under the
field that chose it; versions off the tested pairing are a warning. The nodes' installed
packages are checked again by the launcher's preflight.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement

from jobs.verl_launch import pairs
from service.errors import field_error
from service.recipes.verl.spec import VerlFullyAsyncSpec


def versions(accelerator: str, verl_version: str, setting: Sequence[str]) -> dict[str, str]:
    """Distribution -> version the spec's nodes will run, as far as the service knows it."""
    out = dict(pairs.TESTED.get(accelerator, {}))
    if not out:
        return {}
    out["verl"] = verl_version
    if list(setting) != ["auto"]:
        for text in setting:
            try:
                req = Requirement(text)
            except InvalidRequirement:
                continue
            exact = [s.version for s in req.specifier if s.operator in ("==", "===")]
            if len(exact) == 1 and "*" not in exact[0]:
                out[req.name] = exact[0]
    return out


def _field(spec: VerlFullyAsyncSpec) -> list[str]:
    return ["verl_version"] if spec.verl_version else ["resources", "accelerator"]


def refusals(
    spec: VerlFullyAsyncSpec, verl_version: str, setting: Sequence[str]
) -> list[dict[str, Any]]:
    accelerator = spec.resources.accelerator
    have = versions(accelerator, verl_version, setting)
    return [
        field_error(
            _field(spec),
            f"{', '.join(f'{d} {have[d]}' for d in row.when)} on {accelerator} is a stack pair "
            f"known to break ({row.name}): {row.says()}",
            "stack_pair",
        )
        for row in pairs.broken(accelerator, have)
    ]


def warnings(spec: VerlFullyAsyncSpec, verl_version: str, setting: Sequence[str]) -> list[str]:
    accelerator = spec.resources.accelerator
    off = pairs.untested(accelerator, versions(accelerator, verl_version, setting))
    if not off:
        return []
    return [
        f"{'.'.join(_field(spec))}: {', '.join(off)} on {accelerator} is a combination not "
        "known to work or to break; the worker image carries the tested one"
    ]
