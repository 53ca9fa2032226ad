"""Keys and variables a spec may set that do nothing (or harm) on the stack it runs: warnings.

Each entry names the verl (or vLLM-Ascend) releases it was read in, what to set instead and its
source; a spec setting one is accepted with a warning under the field that set it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from service.errors import dotted
from service.recipes.verl.overrides import Override
from service.recipes.verl.spec import VerlFullyAsyncSpec

_HCCL = (
    "on NPU the collective timeouts are HCCL's environment: set HCCL_EXEC_TIMEOUT and "
    "HCCL_CONNECT_TIMEOUT (seconds) in runtime_env.env_vars"
)


@dataclass(frozen=True)
class DeadKey:
    key: str
    verl: str  # the verl releases in which nothing reads it
    why: str


DEAD_KEYS = tuple(
    DeadKey(
        key,
        ">=0.9.0,<0.9.2",
        f"{key} does nothing in verl 0.9.0-0.9.1: its engine workers start the process group "
        "with torch's default timeout (verl/workers/engine_workers.py, "
        "initialize_global_process_group_ray(timeout_second=None); verl #7815); " + _HCCL,
    )
    for key in ("actor_rollout_ref.nccl_timeout", "critic.nccl_timeout")
)

# vLLM-Ascend 0.23.0's FlashComm variables, which verl's own Ascend examples still export:
# the variable -> what vLLM-Ascend reads instead (vllm_ascend/envs.py and ascend_config.py at
# v0.23.0: a set variable is only a fallback, "will be removed in the next release").
FLASHCOMM = {
    "VLLM_ASCEND_ENABLE_FLASHCOMM1": (
        "deprecated in vLLM-Ascend 0.23 (still read, to be removed)",
        "enable_flashcomm1",
    ),
    "VLLM_ASCEND_FLASHCOMM2_PARALLEL_SIZE": (
        "deprecated in vLLM-Ascend 0.23 (still read, to be removed)",
        "enable_flashcomm2_parallel_size",
    ),
    "VLLM_ASCEND_ENABLE_FLASHCOMM": (
        "not read by vLLM-Ascend 0.23 at all (an older release's name)",
        "enable_flashcomm1",
    ),
}
ADDITIONAL = "+actor_rollout_ref.rollout.engine_kwargs.vllm.additional_config"

# Ray leaves each worker's visible devices alone when told so for the whole job.
NOSET = {
    "npu": "RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES",
    "gpu": "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES",
}


def _in(spec: str, version: str) -> bool:
    try:
        return SpecifierSet(spec).contains(Version(version), prereleases=True)
    except InvalidVersion:
        return False


def warnings(items: Iterable[Override], full: VerlFullyAsyncSpec, verl_version: str) -> list[str]:
    out = []
    for item in items:
        for dead in DEAD_KEYS:
            if item.key == dead.key and _in(dead.verl, verl_version):
                out.append(f"{dotted(item.loc)}: {dead.why}")
    accelerator = full.resources.accelerator
    env = full.runtime_env.env_vars
    if accelerator == "npu":
        for name, (state, key) in FLASHCOMM.items():
            if name in env:
                out.append(
                    f"runtime_env.env_vars.{name}: {state}; set {ADDITIONAL}.{key} instead "
                    "(vLLM-Ascend v0.23.0 vllm_ascend/ascend_config.py)"
                )
    noset = NOSET.get(accelerator)
    if noset is not None and noset in env:
        out.append(
            f"runtime_env.env_vars.{noset}: for the whole job, verl's workers take Ray's "
            "physical device ids as device indices (verl/single_controller/base/worker.py, "
            "get_accelerator_ids() then set_device): on a node whose Ray holds a "
            "non-contiguous or offset device subset (e.g. 4,5,6,7) set_device fails with "
            "'Invalid device ID' (verl #7507, not in verl 0.9.1); leave it unset so Ray sets "
            "each worker's devices"
        )
    return out
