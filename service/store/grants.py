"""Secrets grants: issued when a run that names secrets is submitted (only the token's SHA-256
is kept), redeemed at most once, before expiry, while the run is not over."""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from datetime import timedelta

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from service.store.models import Run, SecretGrant, utcnow
from service.store.status import ENDED

PREFIX = "rlgrant_"
REPLAYED = "grant already redeemed"


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def issue(session: Session, run_id: str, submission_id: str, ttl_s: float) -> str:
    """A new grant for the run's job; its token (256 random bits), never stored or shown."""
    token = PREFIX + secrets.token_urlsafe(32)
    now = utcnow()
    session.add(
        SecretGrant(
            id="grt_" + secrets.token_hex(8),
            run_id=run_id,
            submission_id=submission_id,
            token_hash=digest(token),
            created_at=now,
            expires_at=now + timedelta(seconds=ttl_s),
        )
    )
    session.flush()
    return token


@dataclass(frozen=True)
class Redemption:
    """What a redemption found: the run on success, else why not (for the audit only)."""

    run: Run | None
    submission_id: str | None
    refused: str | None
    run_id: str | None = None


def redeem(session: Session, token: str) -> Redemption:
    """Mark the grant redeemed and answer its run; or why it is refused (unknown, redeemed,
    expired, the run over), which only the audit is told."""
    grant = session.scalar(
        select(SecretGrant).where(SecretGrant.token_hash == digest(token)).with_for_update()
    )
    if grant is None:
        return Redemption(None, None, "unknown grant")
    run = session.get(Run, grant.run_id, with_for_update=True)
    now = utcnow()
    if grant.redeemed_at is not None:
        why = REPLAYED
    elif grant.expires_at <= now:
        why = "grant expired"
    elif run is None or run.status in ENDED:
        why = "the run is over"
    else:
        grant.redeemed_at = now
        return Redemption(run, grant.submission_id, None, grant.run_id)
    return Redemption(None, None, why, grant.run_id)


def purge(session: Session, run_id: str) -> None:
    """Forget the run's grants: its run is over, so none can be redeemed again."""
    session.execute(delete(SecretGrant).where(SecretGrant.run_id == run_id))
