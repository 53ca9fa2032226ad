"""The watchdog: flags runs that are stuck (health ``stuck``) and, by policy, stops them.

Stuck means submitted but not RUNNING within ``submitted_s`` (Ray cannot start it), or RUNNING
without log output for ``silent_s`` (e.g. a placement group that never becomes ready, which Ray
still reports as RUNNING). A run with no recorded output counts as silent since it started.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta

from sqlalchemy import select

from service.store.db import Database
from service.store.lifecycle import request_stop, set_health
from service.store.models import Run, utcnow
from service.store.status import ACTIVE, WATCHDOG_HEALTH, RunStatus


class Watchdog:
    def __init__(
        self,
        db: Database,
        submitted_s: float,
        silent_s: float,
        stop_stuck: bool,
        on_stop: Callable[[], None] = lambda: None,
    ) -> None:
        self.db = db
        self.submitted = timedelta(seconds=submitted_s)
        self.silent = timedelta(seconds=silent_s)
        self.stop_stuck = stop_stuck
        self.on_stop = on_stop

    def tick(self) -> None:
        now = utcnow()
        stopping = False
        with self.db.transaction() as session:
            query = select(Run).where(Run.status.in_(ACTIVE), Run.health.in_(WATCHDOG_HEALTH))
            for run in session.scalars(query.with_for_update()):
                reason = self.stuck_reason(run, now)
                if reason is None:
                    if run.health == "stuck":
                        set_health(session, run, "ok", None)
                    continue
                set_health(session, run, "stuck", reason)
                if self.stop_stuck and request_stop(session, run, f"stuck ({reason})"):
                    stopping = True
        if stopping:
            self.on_stop()

    def stuck_reason(self, run: Run, now: datetime) -> str | None:
        if run.status == RunStatus.SUBMITTED:
            since = run.submitted_at or run.updated_at
            if now - since > self.submitted:
                return (
                    f"not RUNNING {self.submitted.total_seconds():g} s after submission "
                    f"(Ray: {run.ray_status or 'unknown'})"
                )
        elif run.status == RunStatus.RUNNING:
            since = run.last_output_at or run.started_at or run.updated_at
            if now - since > self.silent:
                return f"no log output for {self.silent.total_seconds():g} s while RUNNING"
        return None
