"""``tiny-grpo``: a small GRPO trainer on CPU, in the fully async shape (demo and test workload).

It is not a stand-in for verl. It places a rollout group and a trainer group as Ray actors on
the spec's virtual NPUs, trains a table of logits on toy arithmetic with GRPO, and prints verl's
console metric lines, so placement, the log follower and the metrics path can be exercised
without accelerators. The job code is ``jobs/tiny_grpo``.
"""

from __future__ import annotations

import math
import os
import tempfile
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import Field, model_validator

from jobs import samples as job_samples
from jobs.tiny_grpo import LOGGED_KEYS
from jobs.tiny_grpo.options import DEFAULTS, to_argv
from service.errors import InvalidSpec, field_error
from service.recipes.base import Launch, LaunchContext, RunSpec, target_key_problem
from service.scheduling.shape import Group, ResourceShape

ACTOR_CPUS: float = DEFAULTS["actor_cpus"]
DRIVER_CPUS = 0.25
# The job's options a spec sets (all but the CPUs each actor holds and where checkpoints and
# samples go, which the recipe decides).
OPTIONS = set(DEFAULTS) - {"actor_cpus", "checkpoint_dir", "resume", "rollout_data_dir"}


class TinyGrpoSpec(RunSpec):
    recipe: Literal["tiny-grpo"] = "tiny-grpo"
    prompts: int = Field(DEFAULTS["prompts"], ge=1, le=10_000, description="distinct prompts")
    batch_prompts: int = Field(
        DEFAULTS["batch_prompts"], ge=1, le=1024, description="prompts per trainer step"
    )
    n: int = Field(DEFAULTS["n"], ge=2, le=64, description="responses per prompt (GRPO group)")
    total_rollout_steps: int = Field(
        DEFAULTS["total_rollout_steps"], ge=1, le=10_000_000, description="prompts"
    )
    trigger_parameter_sync_step: int = Field(DEFAULTS["trigger_parameter_sync_step"], ge=1, le=1000)
    staleness_threshold: float = Field(DEFAULTS["staleness_threshold"], ge=0, le=10)
    lr: float = Field(DEFAULTS["lr"], gt=0, le=100)
    is_threshold: float = Field(DEFAULTS["is_threshold"], gt=0)
    rs_threshold: str = Field(
        DEFAULTS["rs_threshold"],
        pattern=r"^\d+(\.\d+)?_\d+(\.\d+)?$",
        description="seq_mean_k1 rejection bounds, lower_upper",
    )
    val_every: int = Field(DEFAULTS["val_every"], ge=1)
    gen_seconds: float = Field(
        DEFAULTS["gen_seconds"], ge=0, le=60, description="simulated generation time"
    )
    train_seconds: float = Field(
        DEFAULTS["train_seconds"], ge=0, le=60, description="simulated update time"
    )
    seed: int = Field(DEFAULTS["seed"], ge=0)
    save_every: int = Field(
        DEFAULTS["save_every"],
        ge=0,
        le=10_000,
        description="checkpoint every N parameter versions into the run's own dir (0: never); "
        "a later attempt resumes from the newest",
    )
    trainer_npus: int = Field(DEFAULTS["trainer_npus"], ge=1, le=64)
    rollout_npus: int = Field(DEFAULTS["rollout_npus"], ge=1, le=64)

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


def default_checkpoint_root(instance: str = "") -> str:
    """Where tiny-grpo runs keep checkpoints when nothing says: this machine's temp dir (the
    embedded cluster's nodes are this machine), in a dir of the service ``instance``'s own that
    the embedded nodes' user is given (two services on one host never share it)."""
    top = f"rlrun-{os.getuid()}-{instance}-runs" if instance else f"rlrun-{os.getuid()}-runs"
    return str(Path(tempfile.gettempdir()) / top / "tiny-grpo-checkpoints")


class TinyGrpoRecipe:
    name: ClassVar[str] = "tiny-grpo"
    spec_model: ClassVar[type[RunSpec]] = TinyGrpoSpec

    def __init__(self, checkpoint_root: str = "") -> None:
        self.checkpoint_root = checkpoint_root or default_checkpoint_root()

    def build(self, spec: Any, ctx: LaunchContext) -> Launch:
        assert isinstance(spec, TinyGrpoSpec)
        never = target_key_problem(spec, LOGGED_KEYS)
        if never is not None:
            raise InvalidSpec(never, [field_error(["stop_when", "key"], never, "never_logged")])
        options = spec.model_dump(include=OPTIONS) | {"actor_cpus": ACTOR_CPUS}
        own = Path(self.checkpoint_root) / ctx.run_id
        if spec.save_every:  # the run's own dir: a later attempt resumes from it
            options["checkpoint_dir"] = str(own)
        shipper: dict[str, str] = {}
        if spec.samples.enabled:  # written by the trainer, shipped as verl's are
            options["rollout_data_dir"] = str(own / job_samples.SUBDIR)
            s = spec.samples
            shipper = job_samples.env(
                options["rollout_data_dir"], s.every, s.per_step, spec.secrets
            )
        argv = to_argv(options)
        return Launch(
            checkpoints=bool(spec.save_every),
            argv=argv,
            runtime_env={
                "env_vars": {
                    "RAY_DEDUP_LOGS": "0",
                    "PYTHONUNBUFFERED": "1",
                    "RAY_JOB_STOP_WAIT_TIME_S": str(min(ctx.stop_grace_s, 10)),
                    **shipper,
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
