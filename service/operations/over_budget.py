"""Letting a queued run through its team's budget: an admin's decision, recorded on the run
(``over_budget_by``) and in the audit trail; the run still waits for capacity and quota."""

from __future__ import annotations

from typing import Any

from service.errors import Conflict
from service.operations.parts import Parts
from service.operations.run_docs import run_doc
from service.principal import Principal, record_call, visible_run
from service.store.runs import events_of
from service.store.status import RunStatus


def admit_over_budget(
    parts: Parts, principal: Principal, run_id: str, client: str | None
) -> dict[str, Any]:
    """The run (a ``RunOut``) once let through, committed; only a queued run may be."""
    with parts.db.transaction() as session:
        run = visible_run(session, principal, run_id, lock=True)
        if run.status != RunStatus.QUEUED:
            raise Conflict(f"run {run_id} is {run.status}, not queued", status_of_run=run.status)
        run.over_budget_by, run.budget_wait = principal.user, None
        record_call(
            session, principal, client, "run.admit_over_budget", run_id=run.id, target=run.team
        )
        doc = run_doc(run, events_of(session, run_id))
    parts.wake("submitter")
    return doc
