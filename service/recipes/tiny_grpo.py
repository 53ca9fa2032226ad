"""``tiny-grpo``: a small GRPO trainer on CPU, in the fully async shape (demo and test workload).

It is not a stand-in for verl. It places a rollout group and a trainer group as Ray actors on
the spec's virtual NPUs, trains a table of logits on toy arithmetic with GRPO, and prints verl's
console metric lines, so placement, the log follower and the metrics path can be exercised
without accelerators. The job code is ``jobs/tiny_grpo``.
"""

from __future__ import annotations

import math
from dataclasses import fields
from typing import Any, ClassVar, Literal

from pydantic import Field, model_validator

from jobs.tiny_grpo.options import Options, help_of, to_argv
from service.recipes.base import Group, Launch, LaunchContext, ResourceShape, RunSpec

ACTOR_CPUS = Options.actor_cpus
DRIVER_CPUS = 0.25
# The job's options a spec sets (all but the CPUs each actor holds, which the recipe decides).
OPTIONS = {f.name for f in fields(Options)} - {"actor_cpus"}


def _field(name: str, **limits: Any) -> Any:
    """A spec field with the job's own default and help for its option ``name``."""
    return Field(default=getattr(Options, name), description=help_of(name), **limits)


class TinyGrpoSpec(RunSpec):
    recipe: Literal["tiny-grpo"] = "tiny-grpo"
    prompts: int = _field("prompts", ge=1, le=10_000)
    batch_prompts: int = _field("batch_prompts", ge=1, le=1024)
    n: int = _field("n", ge=2, le=64)
    total_rollout_steps: int = _field("total_rollout_steps", ge=1, le=10_000_000)
    trigger_parameter_sync_step: int = _field("trigger_parameter_sync_step", ge=1, le=1000)
    staleness_threshold: float = _field("staleness_threshold", ge=0, le=10)
    lr: float = _field("lr", gt=0, le=100)
    is_threshold: float = _field("is_threshold", gt=0)
    rs_threshold: str = _field("rs_threshold", pattern=r"^\d+(\.\d+)?_\d+(\.\d+)?$")
    val_every: int = _field("val_every", ge=1)
    gen_seconds: float = _field("gen_seconds", ge=0, le=60)
    train_seconds: float = _field("train_seconds", ge=0, le=60)
    trainer_npus: int = _field("trainer_npus", ge=1, le=64)
    rollout_npus: int = _field("rollout_npus", ge=1, le=64)
    seed: int = _field("seed", ge=0)

    @model_validator(mode="after")
    def _consistent(self) -> TinyGrpoSpec:
        lower, upper = (float(x) for x in self.rs_threshold.split("_"))
        if not lower < 1.0 < upper:
            raise ValueError("rs_threshold must bracket 1.0, e.g. 0.5_2.0")
        if self.total_rollout_steps < self.batch_prompts:
            raise ValueError("total_rollout_steps must cover at least one batch of prompts")
        return self

    @property
    def trainer_steps(self) -> int:
        return self.total_rollout_steps // self.batch_prompts

    @property
    def total_syncs(self) -> int:
        return math.ceil(self.trainer_steps / self.trigger_parameter_sync_step)


class TinyGrpoRecipe:
    name: ClassVar[str] = "tiny-grpo"
    spec_model: ClassVar[type[RunSpec]] = TinyGrpoSpec

    def build(self, spec: Any, ctx: LaunchContext) -> Launch:
        assert isinstance(spec, TinyGrpoSpec)
        argv = to_argv(
            Options(**spec.model_dump(include=OPTIONS), actor_cpus=ACTOR_CPUS),
        )
        return Launch(
            argv=argv,
            runtime_env={
                "env_vars": {
                    "RAY_DEDUP_LOGS": "0",
                    "PYTHONUNBUFFERED": "1",
                    "RAY_JOB_STOP_WAIT_TIME_S": str(min(ctx.stop_grace_s, 10)),
                }
            },
            shape=ResourceShape(
                accelerator="NPU",
                groups=(
                    Group("trainer", spec.trainer_npus, ACTOR_CPUS),
                    Group("rollout", spec.rollout_npus, ACTOR_CPUS),
                ),
                driver_cpus=DRIVER_CPUS,
            ),
            entrypoint_num_cpus=DRIVER_CPUS,
            total_steps=spec.total_syncs,
            warnings=["tiny-grpo is a demo and test workload on CPU, not a stand-in for verl"],
        )
