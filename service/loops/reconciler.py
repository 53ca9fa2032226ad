"""The reconciler: polls Ray for every active run and records what Ray says.

It also delivers stop requests. A run Ray no longer knows (404) is LOST: Ray keeps no durable
state, so after a head restart our database is the only record of it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.cluster.ray_jobs import JobInfo, RayJobs, stop_job
from service.store.db import Database
from service.store.lifecycle import transition
from service.store.models import Run
from service.store.status import ACTIVE, TERMINAL, RunStatus

_RAY_TO_RUN = {
    "RUNNING": RunStatus.RUNNING,
    "SUCCEEDED": RunStatus.SUCCEEDED,
    "FAILED": RunStatus.FAILED,
    "STOPPED": RunStatus.STOPPED,
}


@dataclass
class Reconciler:
    db: Database
    ray: RayJobs
    # Called after a round in which some run ended (its resources are free for the queue).
    on_end: Callable[[], None] = lambda: None

    def tick(self) -> None:
        with self.db.transaction() as session:
            active = session.execute(
                select(Run.id, Run.stop_requested_at).where(Run.status.in_(ACTIVE))
            ).all()
        observed: dict[str, JobInfo | None] = {}
        for run_id, stop_requested_at in active:
            if stop_requested_at is not None:
                stop_job(self.ray, run_id, "stop requested")
            observed[run_id] = self.ray.get(run_id)
        ended = False
        if observed:
            with self.db.transaction() as session:
                for run_id, info in observed.items():
                    run = session.get(Run, run_id, with_for_update=True)
                    if run is not None and run.status in ACTIVE:
                        apply(session, run, info)
                        ended = ended or run.status in TERMINAL
        if ended:
            self.on_end()


def apply(session: Session, run: Run, info: JobInfo | None) -> None:
    """Fold one observation of Ray into the run (through the one transition function)."""
    if info is None:
        run.ray_status = None
        transition(
            session,
            run,
            RunStatus.LOST,
            f"Ray no longer knows job {run.id} (the Ray head restarted or the job was deleted)",
        )
        return
    run.ray_status = info.status
    run.ray_message = info.message
    run.ray_error_type = info.error_type
    run.ray_exit_code = info.driver_exit_code
    target = _RAY_TO_RUN.get(info.status)
    if target is None or target == run.status:
        return
    transition(session, run, target, _reason(info))


def _reason(info: JobInfo) -> str:
    if info.status == "RUNNING":
        return "Ray reports the job running"
    if info.status == "SUCCEEDED":
        return "the job finished successfully"
    if info.status == "STOPPED":
        return "the job was stopped"
    parts = [info.error_type or "job failed"]
    if info.driver_exit_code is not None:
        parts.append(f"exit code {info.driver_exit_code}")
    if info.message:
        parts.append(info.message.strip().splitlines()[-1][:500])
    return ": ".join(parts)
