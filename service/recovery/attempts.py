"""A run's attempts: the Ray job id of each, and the history ``GET /runs/{id}`` lists.

Attempt 1 is submitted as the run id (as before attempts existed); attempt N >= 2 as
``<run id>-a<N>``. The id is derived from (run, n) alone, so however often a crashed or
competing replica submits an attempt, Ray starts it once ("already exists"). The current
attempt lives on the run's row; ``run_attempts`` keeps the ended ones, written once each when
the next one begins.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.store.models import Run, RunAttempt

_ATTEMPT_JOB = re.compile(r"(.+)-a([2-9]|[1-9][0-9]+)")


def job_id(run_id: str, n: int) -> str:
    """The Ray submission id of attempt ``n`` of a run."""
    return run_id if n <= 1 else f"{run_id}-a{n}"


def run_of_job(submission_id: str) -> str:
    """The run id a submission id belongs to (itself when it names no later attempt)."""
    m = _ATTEMPT_JOB.fullmatch(submission_id)
    return m.group(1) if m else submission_id


def runs_of_jobs(ids: Iterable[str]) -> dict[str, str]:
    """Submission id -> the run id it would belong to."""
    return {i: run_of_job(i) for i in ids}


def archive(session: Session, run: Run) -> None:
    """Keep the run's current (ended) attempt as a ``run_attempts`` row (in the caller's
    transaction; a second archive of the same attempt fails on the key)."""
    session.add(
        RunAttempt(
            run_id=run.id,
            n=run.attempt,
            ray_job_id=job_id(run.id, run.attempt),
            status=run.status,
            submitted_at=run.submitted_at,
            started_at=run.started_at,
            ended_at=run.ended_at,
            failure=run.failure,
            resumed_from_step=run.resumed_from_step,
        )
    )
    session.flush()


def ended(session: Session, run_id: str) -> Sequence[RunAttempt]:
    return session.scalars(
        select(RunAttempt).where(RunAttempt.run_id == run_id).order_by(RunAttempt.n)
    ).all()


def attempt_doc(row: Any, n: int, run_id: str) -> dict[str, Any]:
    return {
        "n": n,
        "ray_job_id": job_id(run_id, n),
        "status": row.status,
        "started_at": row.started_at,
        "ended_at": row.ended_at,
        "failure": row.failure,
        "resumed_from_step": row.resumed_from_step,
    }


def history(run: Any, rows: Sequence[Any]) -> list[dict[str, Any]]:
    """Every attempt of ``run``, the ended ones (``rows``) and the current one."""
    attempt = getattr(run, "attempt", 1) or 1
    return [
        *(attempt_doc(r, r.n, run.id) for r in rows if r.n < attempt),
        attempt_doc(run, attempt, run.id),
    ]
