"""A run's retry policy: what a spec may ask (``retry``), the operator's default and per-team
limits, and the policy in force for a run."""

from __future__ import annotations

from typing import Any, get_args

from pydantic import BaseModel, ConfigDict, Field

from service.errors import InvalidSpec, field_error
from service.recovery.classify import RetryClass

# Attempts a policy may ask for, the first included, whatever the operator allows.
MAX_ATTEMPTS = 20
RETRY_CLASSES: tuple[str, ...] = get_args(RetryClass)
TRANSIENT: tuple[RetryClass, ...] = ("actor_died", "node_lost", "collective_timeout")


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


def team_limit(team: str, per_team: dict[str, int], default: int) -> int:
    return per_team.get(team, per_team.get("*", default))


def check(spec: dict[str, Any], team: str, per_team: dict[str, int], default: int) -> None:
    """422 when the spec's policy asks for more attempts than its team may make."""
    asked = (spec.get("retry") or {}).get("max_attempts")
    limit = team_limit(team, per_team, default)
    if asked is not None and asked > limit:
        msg = f"team {team!r} may make at most {limit} attempts of a run"
        raise InvalidSpec(msg, [field_error(["retry", "max_attempts"], msg, "too_many_attempts")])


def in_force(
    spec: dict[str, Any], team: str, default: RetryPolicy | None, per_team: dict[str, int], cap: int
) -> RetryPolicy | None:
    """The run's own policy, else the operator's default; attempts within the team's limit."""
    own = spec.get("retry")
    policy = RetryPolicy.model_validate(own) if own is not None else default
    if policy is None:
        return None
    limit = team_limit(team, per_team, cap)
    return policy.model_copy(update={"max_attempts": min(policy.max_attempts, limit)})
