"""Cancelling a run: a queued one is CANCELLED at once (Ray never sees it), an active one gets
a stop request (the reconciler stops its job), an ended one is a conflict. Asked ``at:
next_checkpoint``, an active run stops right after its next complete save, or once
``within_s`` has passed, whichever comes first (``lifecycle.request_yield``)."""

from __future__ import annotations

from typing import Any

from service.errors import Conflict, InvalidSpec, field_error
from service.operations.parts import Parts
from service.operations.run_docs import run_doc
from service.principal import Principal, record_call, visible_run
from service.store.lifecycle import request_stop, request_yield, transition
from service.store.runs import events_of
from service.store.status import TERMINAL, RunStatus


def cancel_run(
    parts: Parts,
    principal: Principal,
    run_id: str,
    client: str | None,
    at_checkpoint: bool = False,
    within_s: float | None = None,
) -> dict[str, Any]:
    """The run (a ``RunOut``) after the cancel, committed; ``client`` is the caller's address,
    for the audit trail. Another team's run is not found for a non-admin. ``at_checkpoint``:
    an active run stops at its next checkpoint, within ``within_s`` (default: the setting)."""
    settings = parts.settings
    if at_checkpoint:
        limit = settings.max_stop_within_s
        if within_s is not None and within_s > limit:
            msg = f"at most {limit:g} s (RLRUN_MAX_STOP_WITHIN_S)"
            raise InvalidSpec(msg, [field_error(["within_s"], msg, "less_than_equal")])
        within_s = settings.default_stop_within_s if within_s is None else within_s
    wake = None
    with parts.db.transaction() as session:
        run = visible_run(session, principal, run_id, lock=True)
        if run.status in TERMINAL:
            raise Conflict(f"run {run_id} is already {run.status}", status_of_run=run.status)
        if run.status == RunStatus.QUEUED:
            transition(session, run, RunStatus.CANCELLED, "cancelled before submission")
            # Its place in the queue is free: let the runs behind it move up now.
            wake = "submitter"
        elif at_checkpoint and within_s is not None:
            if request_yield(session, run, within_s, f"cancelled by {principal.user}"):
                wake = "reconciler"
        elif request_stop(session, run):
            wake = "reconciler"
        record_call(session, principal, client, "run.cancel", run_id=run.id, target=run.team)
        doc = run_doc(run, events_of(session, run_id))
    if wake:
        parts.wake(wake)
    return doc
