"""API tokens: made once (the secret is returned, only its SHA-256 kept), found, listed, revoked."""

from __future__ import annotations

import hashlib
import secrets
from typing import Literal, NamedTuple

from sqlalchemy import bindparam, select
from sqlalchemy.orm import Session

from service.errors import NotFound
from service.store.db import Database
from service.store.models import ApiToken, utcnow
from service.store.prepared import Prepared

Role = Literal["viewer", "member", "admin"]
ROLES: tuple[Role, ...] = ("viewer", "member", "admin")
PREFIX = "rlrun_"


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def create(
    session: Session, user: str, team: str, role: Role, created_by: str | None = None
) -> tuple[ApiToken, str]:
    """A new token row and its secret (256 random bits), which is never stored or shown again."""
    secret = PREFIX + secrets.token_urlsafe(32)
    row = ApiToken(
        id="tok_" + secrets.token_hex(8),
        token_hash=digest(secret),
        user=user,
        team=team,
        role=role,
        created_by=created_by,
    )
    session.add(row)
    session.flush()
    return row, secret


_ACTIVE = Prepared(
    select(ApiToken.id, ApiToken.user, ApiToken.team, ApiToken.role).where(
        ApiToken.token_hash == bindparam("token_hash"), ApiToken.revoked_at.is_(None)
    )
)


class ActiveToken(NamedTuple):
    id: str
    user: str
    team: str
    role: Role


async def find_active(db: Database, token_hash: str) -> ActiveToken | None:
    """The unrevoked token whose secret has this ``digest`` (id, user, team, role), read on the
    event loop (``Database.rows``): the one indexed row a request reads to sign in."""
    rows = await db.rows(_ACTIVE, {"token_hash": token_hash})
    return ActiveToken(*rows[0]) if rows else None


def revoked_among(session: Session, ids: list[str]) -> list[str]:
    """Which of the tokens ``ids`` are revoked now."""
    query = select(ApiToken.id).where(ApiToken.id.in_(ids), ApiToken.revoked_at.is_not(None))
    return list(session.scalars(query))


def page(session: Session, limit: int, cursor: str | None = None) -> list[ApiToken]:
    query = select(ApiToken).order_by(ApiToken.id).limit(limit)
    if cursor:
        query = query.where(ApiToken.id > cursor)
    return list(session.scalars(query))


def revoke(session: Session, token_id: str) -> ApiToken:
    row = session.get(ApiToken, token_id, with_for_update=True)
    if row is None:
        raise NotFound(f"no token {token_id!r}")
    if row.revoked_at is None:
        row.revoked_at = utcnow()
    session.flush()
    return row
