"""The log follower: reads each active run's Ray job log from its own offset.

Ray's log tail replays from the start and lags, so the follower polls the whole log, drops the
prefix it has already consumed (``run_logs.log_offset``) and takes only complete lines. In one
transaction per read it stores the text (the service's copy), the metric points, the new offset
and ``runs.last_output_at``: a restart resumes exactly where the last commit ended, with no gap
and no duplicate. Each run's follower is held by one replica through a lease in ``run_logs``
that another replica takes over when it lapses. After a run ends, one final read takes the rest
of the log (even an unterminated last line) and the run's follower is finished.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sqlalchemy import exists, or_, select
from sqlalchemy.orm import Session

from service.cluster.ray_jobs import RayJobs
from service.metrics import logcopy, store
from service.metrics.health import HealthRules, evaluate
from service.metrics.parse import MetricLine, parse_line, parse_preflight
from service.store.db import Database
from service.store.models import Run, RunLog, utcnow
from service.store.status import TERMINAL, RunStatus


@dataclass(frozen=True)
class Held:
    run_id: str
    status: RunStatus
    offset: int


def split_lines(text: str, start: int, final: bool) -> tuple[str, list[tuple[int, str]]]:
    """The consumable part of ``text`` (read at ``start``) and its lines with end offsets."""
    if not final:
        text = text[: text.rfind("\n") + 1]
    lines: list[tuple[int, str]] = []
    pos = start
    for line in text.splitlines(keepends=True):
        pos += len(line)
        lines.append((pos, line))
    return text, lines


@dataclass
class Follower:
    db: Database
    ray: RayJobs
    owner: str
    lease_s: float
    keep_chars: int
    rules: HealthRules
    notify: Callable[[str], None] = lambda _run_id: None
    # For /metrics: points this replica stored, and when each run it holds was last read.
    points_ingested: int = field(default=0, init=False)
    last_read: dict[str, float] = field(default_factory=dict, init=False)

    def tick(self) -> None:
        held = self._claim()
        now = time.time()
        self.last_read = {r.run_id: self.last_read.get(r.run_id, now) for r in held}
        for run in held:
            self.follow(run)

    def _claim(self) -> list[Held]:
        now = utcnow()
        with self.db.transaction() as session:
            # Every run that reached Ray gets a follower, even one that ended between two ticks.
            untracked = session.scalars(
                select(Run.id).where(
                    Run.submitted_at.is_not(None), ~exists().where(RunLog.run_id == Run.id)
                )
            ).all()
            if untracked:
                # Another replica may add the same rows at the same time: the first one wins.
                session.execute(
                    store.dialect_insert(session)(RunLog).on_conflict_do_nothing(),
                    [{"run_id": run_id, "log_offset": 0} for run_id in untracked],
                )
            free = or_(
                RunLog.lease_owner == self.owner,
                RunLog.lease_expires_at.is_(None),
                RunLog.lease_expires_at < now,
            )
            rows = session.execute(
                select(RunLog, Run.status)
                .join(Run, Run.id == RunLog.run_id)
                .where(RunLog.finished_at.is_(None), free)
                .order_by(RunLog.run_id)
                .with_for_update(of=RunLog, skip_locked=True)
            ).all()
            held = []
            for runlog, status in rows:
                runlog.lease_owner = self.owner
                runlog.lease_expires_at = now + timedelta(seconds=self.lease_s)
                held.append(Held(runlog.run_id, RunStatus(status), runlog.log_offset))
        return held

    def release(self) -> None:
        """Give up this replica's leases (on shutdown) so another can take over at once."""
        with self.db.transaction() as session:
            for runlog in session.scalars(select(RunLog).where(RunLog.lease_owner == self.owner)):
                runlog.lease_owner = None
                runlog.lease_expires_at = None

    def follow(self, held: Held) -> None:
        """One read of one run's log. ``held.status`` was read before the log was fetched, so
        when it is terminal the log is complete and this is the final read."""
        final = held.status in TERMINAL
        text = self.ray.logs(held.run_id)
        if text is None and not final:
            return  # Ray does not know the job (yet, or any more): the reconciler decides.
        new, lines = split_lines((text or "")[held.offset :], held.offset, final)
        parsed = [(end, m) for end, line in lines if (m := parse_line(line)) is not None]
        reports = [r for _, line in lines if (r := parse_preflight(line)) is not None]
        with self.db.transaction() as session:
            runlog = session.get(RunLog, held.run_id, with_for_update=True)
            if (
                runlog is None
                or runlog.lease_owner != self.owner
                or runlog.log_offset != held.offset
            ):
                return  # another replica took over meanwhile
            run = session.get(Run, held.run_id, with_for_update=True)
            assert run is not None
            now = utcnow()
            self._ingest(session, run, runlog, new, parsed, now)
            if reports:
                run.preflight = reports[-1]
            if final:
                runlog.finished_at = now
                runlog.lease_owner = None
                runlog.lease_expires_at = None
        self.last_read[held.run_id] = time.time()
        if new or final:
            self.notify(held.run_id)

    def _ingest(
        self,
        session: Session,
        run: Run,
        runlog: RunLog,
        new: str,
        parsed: list[tuple[int, MetricLine]],
        now: datetime,
    ) -> None:
        if new:
            logcopy.append(session, run.id, runlog.log_offset, new, self.keep_chars)
            runlog.log_offset += len(new)
            run.last_output_at = now
        if parsed:
            self.points_ingested += store.add_lines(session, run.id, parsed)
            top = max(m.step for _, m in parsed)
            if runlog.last_step is None or top > runlog.last_step:
                runlog.last_step = top
                runlog.last_step_at = now
        evaluate(session, run, runlog, [m for _, m in parsed], now, self.rules)
        session.flush()
