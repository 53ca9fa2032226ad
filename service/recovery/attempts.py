"""A run's attempts: the Ray job id of each, and the history ``GET /runs/{id}`` lists.

Attempt 1 is submitted as the run id (as before attempts existed); attempt N >= 2 as
``<run id>-a<N>``. The id is derived from (run, n) alone, so however often a crashed or
competing replica submits an attempt, Ray starts it once ("already exists"). The current
attempt lives on the run's row; ``run_attempts`` keeps the ended ones, written once each when
the next one begins (``store.attempts``). No database here: the answers' models use it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any

from service.store.status import attempt_outcome

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


def attempt_doc(row: Any, n: int, run_id: str) -> dict[str, Any]:
    return {
        "n": n,
        "ray_job_id": job_id(run_id, n),
        "status": attempt_outcome(row.status, getattr(row, "attempt_status", None)),
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
