"""A draining node saves first: when Ray reports a node being drained (a spot reclaim, a
maintenance, the autoscaler's idle or preemption drain, ``ray drain-node``), each active run
with work on it (an actor or its job's driver there) is asked to stop at its next complete
checkpoint before the node's deadline, less a margin, and comes back as its next attempt,
which Ray places elsewhere (it schedules nothing on a draining node): the preemption path
(``lifecycle.request_yield`` with a ``DRAINING_NODE`` reason, ``retry.preempted``), spending
no attempt of the run's retry policy and counting as none of its preemptions.

The run's history names the drain (node, deadline; Ray 2.60 keeps the drain's reason to
itself until the node is gone) and what it would lose: the steps since its last save, and,
when its save interval cannot land before the deadline, that they will be lost. A drain with
no deadline gives the run the preemption grace. Each run and node is told once per attempt
(its events say so, whichever replica told it). A cluster whose GCS address is not known is
left alone."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from service.clock import utcnow
from service.cluster.drains import Drain, DrainReader
from service.cluster.registry import ClusterHandle, Clusters
from service.recovery.attempts import job_id
from service.store.db import Database
from service.store.lifecycle import note, request_yield
from service.store.models import Run, RunEvent, RunLog
from service.store.status import ACTIVE, DRAINING_NODE, PREEMPTED_FOR

log = logging.getLogger(__name__)
KIND = "drained"
# The stop is asked this share of the time left before the deadline, at most MARGIN_S: the
# job's own stop and Ray's take time, and the node may go at the deadline.
MARGIN_SHARE, MARGIN_S = 0.1, 30.0


@dataclass
class DrainWatch:
    db: Database
    clusters: Clusters
    # The GCS address of each cluster by name (an embedded head's is its own).
    gcs: Callable[[ClusterHandle], str | None]
    grace_s: float = 300.0  # a drain with no deadline
    on_change: Callable[[], None] = lambda: None
    clock: Callable[[], datetime] = utcnow
    _readers: dict[str, DrainReader] = field(default_factory=dict, init=False)

    def _reader(self, handle: ClusterHandle) -> DrainReader | None:
        address = self.gcs(handle)
        reader = self._readers.get(handle.name)
        if reader is not None and reader.address == address:
            return reader
        if reader is not None:
            reader.close()
        if address is None:
            self._readers.pop(handle.name, None)
            return None
        reader = self._readers[handle.name] = DrainReader(address, handle.ray.token)
        return reader

    def close(self) -> None:
        for reader in self._readers.values():
            reader.close()
        self._readers.clear()

    def tick(self) -> None:
        told = False
        for handle in self.clusters:
            reader = self._reader(handle) if handle.health.up else None
            if reader is None:
                continue
            drains = reader.draining()
            if drains:
                told = self._drained(handle, drains) or told
        if told:
            self.on_change()

    def _drained(self, handle: ClusterHandle, drains: list[Drain]) -> bool:
        """Ask the runs with work on the ``drains`` to save and stop; whether any was asked."""
        on_it = Run.cluster == handle.name
        if handle is self.clusters.primary:
            on_it = or_(on_it, Run.cluster.is_(None))
        with self.db.read() as session:
            rows = session.execute(
                select(Run.id, Run.attempt).where(
                    Run.status.in_(ACTIVE), Run.stop_requested_at.is_(None), on_it
                )
            ).all()
        if not rows:
            return False
        current = {job_id(run_id, n): run_id for run_id, n in rows}
        jobs = {
            str(j["submission_id"]): j
            for j in handle.ray.all_jobs()
            if j.get("submission_id") in current
        }
        hit: dict[str, Drain] = {}
        for drain in drains:
            working = {
                str(a.get("job_id"))
                for a in handle.ray.state("actors", "ALIVE", node_id=drain.node_id)
            }
            for submission, job in jobs.items():
                if job.get("job_id") in working or job.get("driver_node_id") == drain.node_id:
                    hit.setdefault(current[submission], drain)
        if not hit:
            return False
        with self.db.transaction() as session:
            asked = [self._ask(session, run_id, hit[run_id]) for run_id in sorted(hit)]
        return any(asked)

    def _ask(self, session: Session, run_id: str, drain: Drain) -> bool:
        found = session.execute(
            select(Run, RunLog.last_step)
            .outerjoin(RunLog, RunLog.run_id == Run.id)
            .where(Run.id == run_id)
            .with_for_update(of=Run)
        ).first()
        if found is None:
            return False
        run, logged = found
        if run.status not in ACTIVE or run.stop_requested_at is not None:
            return False
        if _told(session, run, drain.node_id):
            return False
        now = self.clock()
        within = self.grace_s
        if drain.deadline is not None:
            left = max(0.0, (drain.deadline - now).total_seconds())
            within = max(1.0, left - min(MARGIN_S, MARGIN_SHARE * left))
        stop_by = now + timedelta(seconds=within)
        base = run.checkpoint_step if run.checkpoint_step is not None else run.resumed_from_step
        unsaved = max(0, (logged or 0) - (base or 0))
        saved = f"step {base}" if base is not None else "its start"
        at = drain.deadline.strftime("%H:%M:%S UTC") if drain.deadline else "none"
        reason = f"{DRAINING_NODE}{drain.node_id} (deadline {at})"
        # A run stopping already for a cancel, its deadline or its target ends as it would:
        # only sooner.
        ending = run.yield_reason if run.yield_by is not None else None
        moves = ending is None or ending.startswith((PREEMPTED_FOR, DRAINING_NODE))
        then = "then it resumes elsewhere" if moves else f"then it ends ({ending})"
        said = (
            f"{drain.said(now)}: asked to stop at its next checkpoint within {within:.0f} s, "
            f"{then} ({unsaved} steps since {saved})"
        )
        note(session, run, said, kind=KIND)
        if not _saves_by(run, stop_by):
            every = run.checkpoint_every_s
            how = f"saves every {every:.0f} s" if every else "has recorded no save yet"
            note(
                session,
                run,
                f"{drain.node_id} drains before its next save ({how}): it will lose the "
                f"steps since {saved} ({unsaved} now) unless it saves in time",
                kind=KIND,
            )
        request_yield(session, run, within, reason if moves or ending is None else ending)
        log.warning("run %s: %s", run.id, said)
        return True


def _told(session: Session, run: Run, node_id: str) -> bool:
    """Whether the run's current attempt was told of this node's drain already."""
    reasons: Iterable[str] = session.scalars(
        select(RunEvent.reason).where(
            RunEvent.run_id == run.id, RunEvent.kind == KIND, RunEvent.attempt == run.attempt
        )
    )
    return any(node_id in r for r in reasons)


def _saves_by(run: Run, stop_by: datetime) -> bool:
    """Whether the run's save interval (the longest gap between its saves the service saw)
    lands a save before ``stop_by``."""
    every = run.checkpoint_every_s
    last = run.checkpoint_at or run.started_at or run.submitted_at
    if every is None or last is None:
        return False
    return last + timedelta(seconds=every) <= stop_by


def gcs_address(handle: ClusterHandle) -> str | None:
    """Where a cluster's draining nodes are read: an embedded head's own GCS, else the one
    its declaration names (None: not known)."""
    return handle.local.gcs_address if handle.local is not None else handle.spec.gcs_address
