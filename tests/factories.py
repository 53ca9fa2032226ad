"""Rows for tests and benchmarks that need a run in the database without going through Ray."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select

from service.recipes.base import Launch
from service.scheduling.shape import Group, ResourceShape
from service.store.db import Database
from service.store.models import Run, RunEvent, utcnow
from service.store.status import RunStatus

_NOT_ON_RAY = {RunStatus.QUEUED, RunStatus.CANCELLED}


def new_run(
    run_id: str = "r1",
    status: RunStatus | str = RunStatus.RUNNING,
    *,
    team: str = "t",
    priority: int = 1,
    npus: int = 0,
    **columns: Any,
) -> Run:
    """A run as the service stores it by ``status`` (submitted and started once it reached Ray),
    holding ``npus`` on one node; ``columns`` set any other column."""
    now = utcnow()
    status = RunStatus(status)
    shape = ResourceShape(groups=(Group("job", npus, 0.0),) if npus else (), driver_cpus=0.1)
    on_ray = status not in _NOT_ON_RAY
    defaults: dict[str, Any] = {
        "id": run_id,
        "name": run_id,
        "recipe": "x",
        "team": team,
        "priority": priority,
        "status": status,
        "spec": {},
        "launch": Launch(argv=["true"], runtime_env={}, shape=shape).as_dict(),
        "created_at": now,
        "updated_at": now,
        "submitted_at": now if on_ray else None,
        "started_at": now if on_ray and status != RunStatus.SUBMITTED else None,
    }
    return Run(**(defaults | columns))


def add_run(
    db: Database, run_id: str = "r1", status: RunStatus | str = RunStatus.RUNNING, **kwargs: Any
) -> str:
    """Store ``new_run(run_id, status, **kwargs)``; returns its id."""
    with db.transaction() as s:
        s.add(new_run(run_id, status, **kwargs))
    return run_id


def read_run(db: Database, run_id: str = "r1") -> tuple[Run, list[str]]:
    """The stored run (detached, every column loaded) and the reasons of its events, in order."""
    with db.transaction() as s:
        run = s.get(Run, run_id)
        assert run is not None, run_id
        reasons = list(s.scalars(select(RunEvent.reason).where(RunEvent.run_id == run_id)))
        s.expunge(run)
    return run, reasons
