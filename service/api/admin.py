"""Admin calls: API tokens (made, listed, revoked) and the audit trail."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request
from pydantic import BaseModel, Field

from service.api.auth import Admin, audited
from service.api.deps import INT32_MAX, ServicesDep
from service.errors import Forbidden
from service.store import audit, tokens
from service.store.tokens import Role
from service.wire.admin import AuditOut, AuditPage, NewToken, TokenOut, TokenPage, token_out

router = APIRouter(tags=["admin"])


class TokenIn(BaseModel):
    user: str = Field(min_length=1, max_length=200, pattern=r"^[^\x00-\x1f\x7f]+$")
    team: str = Field(pattern=r"^[a-z0-9][a-z0-9_-]{0,63}$")
    role: Role = "member"


@router.post("/tokens", status_code=201, response_model=NewToken)
def create_token(
    services: ServicesDep, principal: Admin, request: Request, body: TokenIn
) -> NewToken:
    """A new token for a user of a team; its secret is in this answer only. Not in open mode,
    where every caller is an anonymous admin: there `rlrun token create` on the host makes them."""
    if not services.settings.auth_enabled:
        raise Forbidden(
            "tokens are not made over HTTP without authentication; use `rlrun token create` "
            "on the service's host"
        )
    with services.db.transaction() as session:
        row, secret = tokens.create(session, body.user, body.team, body.role, principal.user)
        target = f"{row.id} {row.role}@{row.team}"
        audited(session, request, principal, "token.create", target=target)
        return NewToken(**token_out(row), token=secret)


@router.get("/tokens", response_model=TokenPage)
def list_tokens(
    services: ServicesDep,
    principal: Admin,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    cursor: str | None = None,
) -> TokenPage:
    with services.db.read() as session:
        rows = tokens.page(session, limit + 1, cursor)
    return TokenPage(
        items=[TokenOut(**token_out(r)) for r in rows[:limit]],
        next_cursor=rows[limit - 1].id if len(rows) > limit else None,
    )


@router.delete("/tokens/{token_id}", response_model=TokenOut)
def revoke_token(
    services: ServicesDep, principal: Admin, request: Request, token_id: str
) -> TokenOut:
    """Revoked at once: the next request with it is a 401, and its live event streams end."""
    with services.db.transaction() as session:
        row = tokens.revoke(session, token_id)
        audited(session, request, principal, "token.revoke", target=row.id)
        out = TokenOut(**token_out(row))
    services.revocations.revoked(token_id)  # committed: end this replica's streams of it now
    return out


@router.get("/audit", response_model=AuditPage)
def read_audit(
    services: ServicesDep,
    principal: Admin,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
    cursor: Annotated[int | None, Query(ge=0, le=INT32_MAX)] = None,
    run_id: str | None = None,
) -> AuditPage:
    """State-changing calls, newest first; pass ``next_cursor`` back as ``cursor``."""
    with services.db.read() as session:
        rows = audit.page(session, limit + 1, cursor, run_id)
        return AuditPage(
            items=[AuditOut.model_validate(r, from_attributes=True) for r in rows[:limit]],
            next_cursor=rows[limit - 1].id if len(rows) > limit else None,
        )
