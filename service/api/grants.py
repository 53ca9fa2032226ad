"""``POST /grants/redeem``: a run's job trades its one-time grant (the bearer credential here, no
API token) for the values of the secrets its spec names. Any refusal is the same 401; one for a
grant the service issued (used, expired, its run over) is audited, at most one row a minute per
grant, whatever address it comes from (a job picks any address of its 127/8)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from sqlalchemy.orm import Session

from service.api.auth import CredentialsDep, client_of
from service.api.deps import ServicesDep
from service.errors import Conflict, Unauthorized
from service.notify import outbox
from service.store import audit, grants
from service.store.lifecycle import note
from service.store.models import Run
from service.team_secrets import SecretMissing

router = APIRouter(tags=["grants"])
REFUSED = "the grant is not valid"


@router.post(
    "/grants/redeem",
    responses={
        401: {"description": "unknown, redeemed, expired, or its run is over (one answer)"},
        409: {"description": "a secret the run names is no longer in the service's store"},
    },
)
def redeem_grant(
    services: ServicesDep, credentials: CredentialsDep, request: Request
) -> JSONResponse:
    """The run's secret values, ``{"env": {var: value}, "submission_id"}``, once."""
    token = credentials.credentials if credentials is not None else ""
    with services.db.transaction() as session:
        found = grants.redeem(session, token) if token.startswith(grants.PREFIX) else None
        if found is None or found.run_id is None:
            # Not a grant the service issued: nothing to record, so an unauthenticated caller
            # cannot fill the audit trail with guesses (a grant has 256 random bits).
            raise Unauthorized(REFUSED)
        run, values, missing = found.run, {}, None
        client = client_of(request)
        if run is not None:
            try:
                values = services.secrets.resolve(run.team, run.launch.get("secrets") or {})
            except SecretMissing as exc:
                missing = str(exc)
            target = missing
        else:
            # One row a minute per grant, however many times and from wherever it is tried.
            count = services.grant_refusals.count(grants.digest(token))
            target = f"{found.refused}; refusals={count}" if count else None
            if count and found.refused == grants.REPLAYED:
                _tell_replay(session, found.run_id, client)
        if run is not None or target is not None:
            audit.record(
                session,
                audit.entry(
                    user="job",
                    team=run.team if run is not None else None,
                    role="grant",
                    action="grant.redeem" if run is not None else "grant.refused",
                    client=client,
                    run_id=found.run_id,
                    target=target,
                ),
            )
    if run is None:
        raise Unauthorized(REFUSED)
    if missing:
        raise Conflict(missing)
    body = {"env": values, "submission_id": found.submission_id}
    return JSONResponse(body, headers={"Cache-Control": "no-store"})


def _tell_replay(session: Session, run_id: str, client: str | None) -> None:
    """A grant presented after it was redeemed: one of the two callers was not the run's job,
    and whoever came first holds the values. An event of the run, and a webhook message."""
    run = session.get(Run, run_id)
    if run is None:
        return
    event = note(
        session,
        run,
        f"its secrets grant was presented again after it was redeemed (from {client}); "
        "whoever redeemed it first holds the run's secret values",
    )
    outbox.enqueue(session, run, event, "run.grant_replayed")
