"""Rows for tests and benchmarks that need a run in the database without going through Ray."""

from __future__ import annotations

from service.store.db import Database
from service.store.models import Run, utcnow
from service.store.status import RunStatus


def add_run(db: Database, run_id: str = "r1", status: RunStatus = RunStatus.RUNNING) -> str:
    """A submitted, started run with an empty launch."""
    with db.transaction() as s:
        now = utcnow()
        s.add(
            Run(
                id=run_id,
                name=run_id,
                recipe="x",
                team="t",
                status=status,
                spec={},
                launch={"argv": [], "entrypoint": "", "runtime_env": {}, "shape": {}},
                submitted_at=now,
                started_at=now,
            )
        )
    return run_id
