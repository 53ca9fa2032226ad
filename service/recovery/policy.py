"""A run's retry policy in force: the spec's own (``retry``) or the operator's default, within
the team's limit (the policy's shape: ``service.retry_policy``)."""

from __future__ import annotations

from typing import Any

from service.errors import InvalidSpec, field_error
from service.retry_policy import RetryPolicy


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
