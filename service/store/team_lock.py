"""Accepts of one team take turns: what counts the team's recent runs (the per-minute limit)
and then adds one must not interleave with another accept of the same team.

PostgreSQL: a transaction-scoped advisory lock per team (released at commit or rollback; its
wait is bounded by the session's ``lock_timeout``, like any lock). SQLite: writers already take
turns (``BEGIN IMMEDIATE``), so nothing more is needed.
"""

from __future__ import annotations

import hashlib

from sqlalchemy import text
from sqlalchemy.orm import Session

# The first key of the two-key advisory lock: what the lock is for ("rlrn" as an int4).
_ACCEPTS = int.from_bytes(b"rlrn", "big", signed=True)


def lock_team(session: Session, team: str) -> None:
    if session.get_bind().dialect.name != "postgresql":
        return
    key = int.from_bytes(hashlib.sha256(team.encode()).digest()[:4], "big", signed=True)
    session.execute(
        text("SELECT pg_advisory_xact_lock(:kind, :team)"), {"kind": _ACCEPTS, "team": key}
    )
