"""Who is calling, as the service's rules see it: a ``Principal`` (user, team, role), which
runs it may see, and the record of what it changed. How a request becomes a principal (bearer
tokens, OIDC) is ``service.api.auth``'s."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy.orm import Session

from service.errors import NotFound
from service.store import audit
from service.store.models import Run
from service.store.runs import load_run, team_of
from service.store.tokens import ROLES, Role


@dataclass(frozen=True)
class Principal:
    user: str
    team: str | None  # None in open mode: no team of its own
    role: Role
    token_id: str | None = None

    @property
    def key(self) -> str:
        """What per-caller limits count against."""
        return self.token_id or "anonymous"

    def at_least(self, role: Role) -> bool:
        return ROLES.index(self.role) >= ROLES.index(role)

    def sees(self, team: str) -> bool:
        return self.role == "admin" or team == self.team


def visible_run(session: Session, principal: Principal, run_id: str, lock: bool = False) -> Run:
    """The run if the caller may see it; another team's run is not found (a 404, not a 403)."""
    run = load_run(session, run_id, lock=lock)
    ensure_sees(principal, run.team, run_id)
    return run


def require_visible(session: Session, principal: Principal, run_id: str) -> None:
    """Whether the run exists for the caller, in one small query (no ORM object)."""
    ensure_sees(principal, team_of(session, run_id), run_id)


def ensure_sees(principal: Principal, team: str, run_id: str) -> None:
    if not principal.sees(team):
        raise NotFound(f"no run {run_id!r}")


def record_call(
    session: Session,
    principal: Principal,
    client: str | None,
    action: str,
    run_id: str | None = None,
    target: str | None = None,
) -> None:
    """Record a state-changing call of ``principal`` from ``client`` (its address) in the
    caller's transaction (it commits with the change)."""
    audit.record(session, call_entry(principal, client, action, run_id, target))


def call_entry(
    principal: Principal,
    client: str | None,
    action: str,
    run_id: str | None = None,
    target: str | None = None,
) -> dict[str, Any]:
    """The audit row of a call of ``principal`` (``audit.entry``)."""
    return audit.entry(
        user=principal.user,
        team=principal.team,
        role=principal.role,
        token_id=principal.token_id,
        action=action,
        client=client,
        run_id=run_id,
        target=target,
    )
