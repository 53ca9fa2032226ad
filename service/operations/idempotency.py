"""Idempotent accepts: a caller's ``Idempotency-Key`` with the digest of its body, and the
answer a key already used gets again."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.errors import Conflict
from service.operations.run_docs import run_doc
from service.principal import Principal
from service.store.models import Run
from service.store.runs import RUN_COLUMNS, events_of


@dataclass(frozen=True)
class Accepted:
    """A run accepted (stored as QUEUED), or, ``replayed``, accepted before under the key."""

    run_id: str
    doc: dict[str, Any]  # a ``RunOut``
    replayed: bool = False


def request_hash(body: Any) -> str:
    return hashlib.sha256(
        json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    ).hexdigest()


def scoped_key(principal: Principal, key: str | None) -> str | None:
    """Idempotency keys are the caller's own, by its identity (the API token's id, or the
    digest of an OIDC issuer and subject): another caller's equal key is another key, even
    under the same user and team names. An empty key is no key."""
    if not key:
        return None
    return hashlib.sha256(f"{principal.key}\0{key}".encode()).hexdigest()


def replay(session: Session, key: str, digest: str) -> Accepted | None:
    """The answer for an Idempotency-Key already used, or None if it was not."""
    run = session.execute(
        select(*RUN_COLUMNS, Run.request_hash).where(Run.idempotency_key == key)
    ).one_or_none()
    if run is None:
        return None
    if run.request_hash != digest:
        raise Conflict(
            "this Idempotency-Key was used with a different request body",
            run_id=run.id,
        )
    return Accepted(run.id, run_doc(run, events_of(session, run.id)), replayed=True)
