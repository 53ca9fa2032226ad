"""Retrying a run by hand: its next attempt, from its checkpoint or from scratch (the rules
are ``recovery.retry``'s); a run that has not ended is a conflict."""

from __future__ import annotations

from typing import Any

from service.operations.parts import Parts
from service.operations.run_docs import run_doc
from service.principal import Principal, record_call, visible_run
from service.recovery.retry import ResumeFrom, by_hand
from service.store import attempts
from service.store.runs import events_of


def retry_run(
    parts: Parts, principal: Principal, run_id: str, resume: ResumeFrom, client: str | None
) -> dict[str, Any]:
    """The run (a ``RunOut``) with its next attempt queued, committed; audited as
    ``run.retry``. Another team's run is not found for a non-admin."""
    with parts.db.transaction() as session:
        run = visible_run(session, principal, run_id, lock=True)
        by_hand(session, run, resume, principal.user)
        record_call(session, principal, client, "run.retry", run_id=run.id, target=run.team)
        doc = run_doc(run, events_of(session, run_id), ended=attempts.ended(session, run_id))
    parts.wake("submitter")
    return doc
