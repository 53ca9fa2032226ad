"""Cancelling a run: a queued one is CANCELLED at once (Ray never sees it), an active one gets
a stop request (the reconciler stops its job), an ended one is a conflict."""

from __future__ import annotations

from typing import Any

from service.errors import Conflict
from service.operations.parts import Parts
from service.operations.run_docs import run_doc
from service.principal import Principal, record_call, visible_run
from service.store.lifecycle import request_stop, transition
from service.store.runs import events_of
from service.store.status import TERMINAL, RunStatus


def cancel_run(
    parts: Parts, principal: Principal, run_id: str, client: str | None
) -> dict[str, Any]:
    """The run (a ``RunOut``) after the cancel, committed; ``client`` is the caller's address,
    for the audit trail. Another team's run is not found for a non-admin."""
    wake = None
    with parts.db.transaction() as session:
        run = visible_run(session, principal, run_id, lock=True)
        if run.status in TERMINAL:
            raise Conflict(f"run {run_id} is already {run.status}", status_of_run=run.status)
        if run.status == RunStatus.QUEUED:
            transition(session, run, RunStatus.CANCELLED, "cancelled before submission")
            # Its place in the queue is free: let the runs behind it move up now.
            wake = "submitter"
        elif request_stop(session, run):
            wake = "reconciler"
        record_call(session, principal, client, "run.cancel", run_id=run.id, target=run.team)
        doc = run_doc(run, events_of(session, run_id))
    if wake:
        parts.wake(wake)
    return doc
