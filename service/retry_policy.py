"""What a retry policy says, as a spec (``retry``) or the operator (``RLRUN_RETRY_DEFAULT``)
writes it: the failure classes, the bounds and the policy's shape. Words only, no decision
(``recovery/policy.py`` decides the policy in force), so that specs and settings can name it."""

from __future__ import annotations

from typing import Literal, get_args

from pydantic import BaseModel, ConfigDict, Field

# The classes a run's failure can have; those from ``ended_early`` on are decided from the
# run's state, not its log. A retry policy may name every class but ``cancelled``.
RetryClass = Literal[
    "npu_oom",
    "host_oom",
    "device_error",
    "collective_timeout",
    "collective_error",
    "actor_died",
    "node_lost",
    "unschedulable",
    "import_error",
    "config_error",
    "missing_path",
    "async_pipeline_error",
    "nan",
    "killed_outside",
    "ended_early",
    "stopped_outside",
    "cluster_down",
    "unknown",
]
# Attempts a policy may ask for, the first included, whatever the operator allows.
MAX_ATTEMPTS = 20
RETRY_CLASSES: tuple[str, ...] = get_args(RetryClass)
TRANSIENT: tuple[RetryClass, ...] = (
    "actor_died",
    "node_lost",
    "collective_timeout",
    "killed_outside",
)


class RetryPolicy(BaseModel):
    """Retry a run that ends FAILED or LOST with one of these failure classes, as a new
    attempt of the same run that resumes from its checkpoint."""

    model_config = ConfigDict(extra="forbid")

    max_attempts: int = Field(
        2, ge=1, le=MAX_ATTEMPTS, description="attempts in all, the first included"
    )
    on: list[RetryClass] = Field(
        default_factory=lambda: list(TRANSIENT),
        max_length=len(RETRY_CLASSES),
        description="failure classes that start a next attempt",
    )
    backoff_s: float = Field(
        30.0, ge=0, le=86_400, description="seconds between an attempt's end and the next"
    )
