"""A run's health beside its status: ``ok`` or a named problem, with a reason.

Ray says RUNNING even while a placement group waits forever; health is how the service says
what Ray does not. Every check writes through ``set_health``.
"""

from __future__ import annotations

from typing import Literal

from sqlalchemy.orm import Session

from service.models import Run
from service.status import note

Health = Literal["ok", "stuck", "stalled", "nan", "reward_collapse"]


def set_health(session: Session, run: Run, health: Health, reason: str | None) -> bool:
    """Record a change of health (with an event); returns whether anything changed."""
    if run.health == health and run.health_reason == reason:
        return False
    run.health = health
    run.health_reason = reason
    note(session, run, f"health {health}: {reason or 'recovered'}")
    return True
