"""A run's deadline: ``max_duration_s`` from its spec and its team's limit (the smaller), counted
from admission, so set-up (the image, the preflight, the model's load) counts; and how long
before it the run is asked to stop at its next checkpoint."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

# A run that saves seldom is asked this many of its save intervals before its deadline.
INTERVALS_AHEAD = 1.5


def max_duration_s(spec: Mapping[str, Any], team: str, limits: Mapping[str, float]) -> float | None:
    """The longest an attempt of this run may last (None: no limit)."""
    team_limit = limits.get(team, limits.get("*"))
    asked = spec.get("max_duration_s")
    found = [float(v) for v in (asked, team_limit) if v is not None]
    return min(found) if found else None


def deadline(
    admitted: datetime, spec: Mapping[str, Any], team: str, limits: Mapping[str, float]
) -> datetime | None:
    limit = max_duration_s(spec, team, limits)
    return None if limit is None else admitted + timedelta(seconds=limit)


def margin_s(setting_s: float, checkpoint_every_s: float | None) -> float:
    """How long before its deadline a run is asked to stop at its next checkpoint: the
    setting, or its own save interval when that is longer (its next save then falls before
    the deadline)."""
    return max(setting_s, INTERVALS_AHEAD * (checkpoint_every_s or 0.0))
