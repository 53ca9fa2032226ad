"""What a run's lifecycle announces, and who listens.

``store/lifecycle.py`` (the one writer of a run's status) announces each change here, in the
transaction of the change; the floors above that act on it register their listeners
(``service/listeners.py``: the webhook outbox, the usage totals, a failure's explanation), so
the store imports none of them. A listener writes in the caller's session and flushes, never
commits: what it writes (an outbox row) commits or rolls back with the change itself (a
transactional outbox).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from sqlalchemy.orm import Session

from service.store.models import Run, RunEvent


class EventListener(Protocol):
    def __call__(
        self, session: Session, run: Run, event: RunEvent, event_type: str, **extra: Any
    ) -> Any: ...


@dataclass
class Listeners:
    """Who hears what, in the order they registered."""

    # A run's attempt ended (the run terminal, or RETRYING; before its event is written), and when.
    ended: list[Callable[[Session, Run, datetime], Any]] = field(default_factory=list)
    # A run ended without reaching Ray: no log to wait for before its failure is told.
    ended_off_ray: list[Callable[[Session, Run], Any]] = field(default_factory=list)
    # An event subscribers may want: "run.status", "run.retrying" (with ``attempt``),
    # "run.health".
    event: list[EventListener] = field(default_factory=list)


LISTENERS = Listeners()


def ready() -> Listeners:
    """The listeners, refusing a change nobody was registered to hear: without the outbox's
    listener a status change would commit without the deliveries it owes."""
    if not LISTENERS.event:
        raise RuntimeError(
            "no listener of run changes is registered: call service.listeners.register() first"
        )
    return LISTENERS


def ended(session: Session, run: Run, at: datetime) -> None:
    for listener in ready().ended:
        listener(session, run, at)


def ended_off_ray(session: Session, run: Run) -> None:
    for listener in ready().ended_off_ray:
        listener(session, run)


def event(session: Session, run: Run, ev: RunEvent, event_type: str, **extra: Any) -> None:
    for listener in ready().event:
        listener(session, run, ev, event_type, **extra)
