"""What a verl spec may ask of the cluster, checked before anything is composed or launched.

Overrides: config-group options only from verl's own config tree (no paths, no ``@package``
re-targeting), no interpolation (``${``), no ``_target_`` (object instantiation), nothing under
``ray_kwargs`` (``ray.init`` of the job's driver) or Hydra's own settings. pip: plain
``name[extras] specifiers`` requirements, matched whole. Env names: ``service.recipes.env_names``.
(The paths of the composed config are checked later, ``paths``.) A deployment widens this by
settings (``RLRUN_OVERRIDE_ALLOW``, ``RLRUN_ENV_ALLOW``), never a request.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement

from service.errors import field_error
from service.recipes import env_names
from service.recipes.verl.hydra_check import FULLY_ASYNC_CONFIG, TRAINER_CONFIG, verl_root
from service.recipes.verl.overrides import Override, read

DENIED_KEYS = ("ray_kwargs", "hydra")
VERSION = r"[A-Za-z0-9.*+!_-]+"
SPECIFIER = rf"(?:~=|===|==|!=|<=|>=|<|>) *{VERSION}"
PIP_REQUIREMENT = re.compile(
    r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?"
    r"(?: *\[ *[A-Za-z0-9][A-Za-z0-9._-]*(?: *, *[A-Za-z0-9][A-Za-z0-9._-]*)* *\])?"
    rf"(?: *{SPECIFIER}(?: *, *{SPECIFIER})*)?"
)


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
