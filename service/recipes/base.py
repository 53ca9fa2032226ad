"""What a recipe is: a spec model, and a function from a validated spec to a ``Launch``."""

from __future__ import annotations

import difflib
import shlex
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, field_validator

from service.recipes import env_names
from service.retry_policy import RetryPolicy
from service.scheduling.shape import ResourceShape
from service.wire.webhooks import Threshold


class PlacementSpec(BaseModel):
    """Which clusters a run may go to, by what they are (see ``cluster`` for one by name)."""

    model_config = ConfigDict(extra="forbid")

    accelerator: Literal["NPU", "GPU"] | None = Field(
        default=None, description="only clusters of this accelerator kind"
    )
    labels: dict[str, str] = Field(
        default_factory=dict,
        max_length=20,
        description="only clusters carrying every one of these labels",
        examples=[{"site": "hz"}],
    )


class SamplesOption(BaseModel):
    """Which rollout samples the job ships to the service (``GET /runs/{id}/samples``)."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(default=True, description="false: the run keeps no samples")
    every: int = Field(
        default=1, ge=1, le=100_000, description="ship every N-th step (and the first)"
    )
    per_step: int = Field(
        default=64, ge=1, le=1024, description="samples shipped per step at most (the first ones)"
    )


class StopWhen(Threshold):
    """Stop the run at its next checkpoint, ending SUCCEEDED ("target reached at step N"), once
    ``key op value`` holds for ``for_steps`` consecutive logged steps."""


class RunSpec(BaseModel):
    """Fields every run request carries; a recipe's spec model extends this."""

    model_config = ConfigDict(extra="forbid")

    recipe: str
    name: str | None = Field(default=None, min_length=1, max_length=200)
    team: str = Field(default="default", pattern=r"^[a-z0-9][a-z0-9_-]{0,63}$")
    priority: Literal["low", "normal", "high"] = "normal"
    stuck_after_s: float | None = Field(
        default=None,
        ge=60,
        le=7 * 86400,
        description="this run is stuck when not RUNNING this long after submission, or RUNNING "
        "without log output this long (unset: the service's RLRUN_STUCK_SUBMITTED_S and "
        "RLRUN_STUCK_SILENT_S); the last resort after the unschedulable check",
    )
    secrets: dict[str, str] = Field(
        default_factory=dict,
        max_length=50,
        description="env var -> name of a secret the service holds, filled in at submit time",
        examples=[{"WANDB_API_KEY": "wandb-team-key"}],
    )
    retry: RetryPolicy | None = Field(
        default=None, description="retry as attempts of this run (default: the operator's)"
    )
    cluster: str | None = Field(
        default=None,
        pattern=r"^[a-z0-9][a-z0-9-]{0,62}$",
        description="the cluster to run on (`GET /clusters`); unset: any the team may use",
    )
    placement: PlacementSpec | None = Field(
        default=None, description="the kind of cluster to run on, when no `cluster` is named"
    )
    max_duration_s: float | None = Field(
        default=None,
        gt=0,
        le=366 * 86400,
        description="the longest an attempt may last, counted from admission (set-up counts); "
        "near the end it is asked to stop at its next checkpoint, at the end it is stopped "
        "(its team's RLRUN_TEAM_MAX_DURATION_S may be shorter)",
    )
    samples: SamplesOption = Field(
        default_factory=SamplesOption,
        description="rollout samples brought back from the trainer's node (on by default)",
    )
    stop_when: StopWhen | None = Field(
        default=None,
        description="a target: once reached, the run stops at its next checkpoint and ends "
        'SUCCEEDED, "target reached at step N"; a key the recipe never logs is refused '
        "(tiny-grpo) or warned about (verl)",
        examples=[{"key": "val-core/reward/mean", "op": ">=", "value": 0.8, "for_steps": 3}],
    )

    @field_validator("secrets")
    @classmethod
    def _secret_refs(cls, value: dict[str, str]) -> dict[str, str]:
        for var, name in value.items():
            if not env_names.NAME.fullmatch(var):
                raise ValueError(f"{var!r} is not an environment variable name")
            # Whether a secret by this name can exist is the store's to answer: a name no
            # secret can have is answered exactly as a missing one (``team_secrets.valid``).
            if len(name) > 200:
                raise ValueError("a secret name is at most 200 characters")
        return value


def target_key_problem(spec: RunSpec, logged: frozenset[str]) -> str | None:
    """Why ``spec``'s target can never be reached by a run that logs ``logged`` keys (None:
    it names one of them, or there is no target)."""
    if spec.stop_when is None or spec.stop_when.key in logged:
        return None
    near = difflib.get_close_matches(spec.stop_when.key, sorted(logged), n=1, cutoff=0.5)
    hint = f" (did you mean {near[0]!r}?)" if near else ""
    return f"{spec.recipe} never logs {spec.stop_when.key!r}{hint}"


@dataclass(frozen=True)
class LaunchContext:
    """What a recipe may know about the run and the deployment when it builds the launch."""

    run_id: str
    stop_grace_s: int = 120


# Where a run's files are unpacked in the job's working directory: a directory on no import
# path and no Python identifier, so no shipped file can stand in for a module
# (see service.recipes.verl.shipped).
RUN_FILES_DIR = "run-files"


@dataclass(frozen=True)
class Launch:
    """The job as Ray will see it. ``argv`` is joined with shell quoting, never formatted."""

    argv: list[str]
    runtime_env: dict[str, Any]
    shape: ResourceShape
    entrypoint_num_cpus: float = 0.0
    entrypoint_resources: dict[str, float] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    # How many parameter syncs the run plans (progress is the current parameter version of it).
    total_steps: int | None = None
    # The metric whose value is that version (None: metrics.keys.STEP_KEY, fully async's).
    progress_key: str | None = None
    # Samples one sync consumes, when the job may plan fewer than the spec asks (verl takes the
    # smaller of total_rollout_steps and its data's size, and logs it): see recovery.ending.
    samples_per_sync: int | None = None
    # Small text files shipped with the job (name -> text), unpacked in RUN_FILES_DIR of its
    # working directory.
    files: dict[str, str] = field(default_factory=dict)
    # Env var -> secret name: values are filled in by the service when it submits, never stored.
    secrets: dict[str, str] = field(default_factory=dict)
    # Absolute paths and URIs the job reads on the nodes: a cluster with data roots must hold
    # them all to take the run.
    reads: list[str] = field(default_factory=list)
    # Whether the job saves checkpoints a later attempt resumes from (preemption spares a run
    # that saves none, and its plan says so).
    checkpoints: bool = False

    @property
    def entrypoint(self) -> str:
        return shlex.join(self.argv)

    def as_dict(self) -> dict[str, Any]:
        return {
            "argv": self.argv,
            "entrypoint": self.entrypoint,
            "runtime_env": self.runtime_env,
            "shape": self.shape.as_dict(),
            "entrypoint_num_cpus": self.entrypoint_num_cpus,
            "entrypoint_resources": self.entrypoint_resources,
            "warnings": self.warnings,
            "total_steps": self.total_steps,
            "progress_key": self.progress_key,
            "samples_per_sync": self.samples_per_sync,
            "files": self.files,
            "secrets": self.secrets,
            "reads": self.reads,
            "checkpoints": self.checkpoints,
        }


class Recipe(Protocol):
    name: ClassVar[str]
    spec_model: ClassVar[type[RunSpec]]

    def build(self, spec: Any, ctx: LaunchContext) -> Launch:
        """Turn a validated spec into a launch; raise ``InvalidSpec`` for a rule it breaks."""
        ...
