"""Rows for tests and benchmarks that need a run in the database without going through Ray."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import event, select

from service import usage
from service.loops.follower import Follower
from service.metrics.health import HealthRules
from service.metrics.log_readers import WholeLogReader
from service.recipes.base import Launch
from service.scheduling.shape import Group, ResourceShape
from service.store.db import Database, upgrade
from service.store.models import Run, RunAttempt, RunEvent, Webhook, utcnow
from service.store.status import TERMINAL, RunStatus
from service.store.tokens import Role
from service.store.tokens import create as create_token

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


def add_used(
    db: Database, run_id: str, team: str, npus: int, since: datetime, until: datetime
) -> None:
    """A run of ``team`` that held ``npus`` from ``since`` until it ended at ``until``, its
    usage accrued (as the lifecycle leaves it)."""
    with db.transaction() as s:
        run = new_run(
            run_id, RunStatus.SUCCEEDED, team=team, npus=npus, submitted_at=since, ended_at=until
        )
        s.add(run)
        s.flush()
        usage.accrue(s, run, until)


def whole_log_follower(db: Database, ray: Any, **hooks: Any) -> Follower:
    """A follower of every run on ``ray`` (a ``FakeRay``) that reads each log whole; ``hooks``:
    what it calls on an end or a checkpoint."""
    return Follower(
        db, ray, "me", 30.0, 100_000, HealthRules(), reader=WholeLogReader(ray), **hooks
    )


def read_run(db: Database, run_id: str = "r1") -> tuple[Run, list[str]]:
    """The stored run (detached, every column loaded) and the reasons of its events, in order."""
    with db.transaction() as s:
        run = s.get(Run, run_id)
        assert run is not None, run_id
        reasons = list(s.scalars(select(RunEvent.reason).where(RunEvent.run_id == run_id)))
        s.expunge(run)
    return run, reasons


def fill_for_fuzzing(db: Database) -> list[str]:
    """Runs of two teams in every status (with their events, an archived attempt, kept usage)
    for a fuzzer's reads to find; their ids."""
    ids = []
    with db.transaction() as s:
        for i, status in enumerate(RunStatus):
            for team in ("vision", "speech"):
                run = new_run(f"fuzz-{team}-{status.lower()}", status, team=team, npus=8, attempt=2)
                s.add(run)
                s.flush()
                s.add(
                    RunEvent(
                        run_id=run.id,
                        at=run.created_at,
                        from_status=None,
                        to_status=status,
                        reason="filled",
                        attempt=2,
                    )
                )
                s.add(
                    RunAttempt(
                        run_id=run.id, n=1, ray_job_id=run.id, status="FAILED", ended_at=utcnow()
                    )
                )
                if status in TERMINAL and run.submitted_at is not None:
                    run.ended_at = utcnow()
                    usage.accrue(s, run, run.ended_at + timedelta(hours=i))
                ids.append(run.id)
    return ids


def add_webhook(
    db: Database,
    events: list[str],
    *,
    hook_id: str = "whk_1",
    team: str | None = None,
    url: str = "http://127.0.0.1:9/",
    **columns: Any,
) -> str:
    """Store a subscription to ``events`` (of every team unless ``team``); returns its id."""
    with db.transaction() as s:
        s.add(
            Webhook(
                id=hook_id,
                team=team,
                created_by=columns.pop("created_by", "ann"),
                url=url,
                rules={"events": events},
                secret=columns.pop("secret", "whsec_" + "A" * 44),
                **columns,
            )
        )
    return hook_id


def add_tokens(db: Database, *users: tuple[str, str, Role]) -> list[str]:
    """An API token for each ``(user, team, role)``: their secrets, in order."""
    with db.transaction() as s:
        return [create_token(s, user, team, role)[1] for user, team, role in users]


def migrated_with_tokens(url: str, *users: tuple[str, str, Role]) -> list[str]:
    """Migrate the database ``url`` and add a token per ``(user, team, role)``: their secrets,
    in order."""
    upgrade(url)
    db = Database(url)
    tokens = add_tokens(db, *users)
    db.dispose()
    return tokens


def sqlite_with_tokens(
    tmp_path: Path, name: str, *users: tuple[str, str, Role]
) -> tuple[str, list[str]]:
    """A migrated SQLite database ``name`` in ``tmp_path`` with a token per ``(user, team,
    role)``: its URL and the tokens' secrets, in order."""
    url = f"sqlite:///{tmp_path}/{name}"
    return url, migrated_with_tokens(url, *users)


@contextlib.contextmanager
def statements(db: Database, kind: str = "", upper: bool = False) -> Iterator[list[str]]:
    """The statements run on ``db``'s engines meanwhile (those starting with ``kind``, e.g.
    "SELECT"), as run or (``upper``) each on one line in capitals."""
    seen: list[str] = []

    def record(_conn: object, _cursor: object, sql: str, *_: object) -> None:
        line = " ".join(sql.split()).upper()
        if line.startswith(kind):
            seen.append(line if upper else sql)

    for engine in db.engines:
        event.listen(engine, "before_cursor_execute", record)
    try:
        yield seen
    finally:
        for engine in db.engines:
            event.remove(engine, "before_cursor_execute", record)


def rename_run(db: Database, run_id: str, name: str) -> None:
    """A committed write to the run: its new name."""
    with db.transaction() as s:
        run = s.get(Run, run_id)
        assert run is not None
        run.name = name
