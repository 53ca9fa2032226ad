"""The audit trail: one row per state-changing call, written in that call's transaction."""

from __future__ import annotations

from typing import Any

from sqlalchemy import insert, select
from sqlalchemy.orm import Session

from service.store.models import AuditEntry

_INSERT = insert(AuditEntry)


def entry(
    *,
    user: str,
    role: str,
    action: str,
    team: str | None = None,
    token_id: str | None = None,
    client: str | None = None,
    run_id: str | None = None,
    target: str | None = None,
) -> dict[str, Any]:
    """An audit row's values (``at`` is the column's default); a caller with no team, no token
    or no address leaves it out."""
    return {
        "user": user,
        "team": team,
        "role": role,
        "token_id": token_id,
        "action": action,
        "run_id": run_id,
        "target": target[:200] if target else None,
        "client": client[:100] if client else None,
    }


def record(session: Session, *entries: dict[str, Any]) -> None:
    """Audit rows (``entry``), in the session's transaction, in one Core insert: nothing reads
    them back in the transaction that writes them."""
    if entries:
        session.connection().execute(_INSERT, list(entries))


# Who audit rows name for what the service saw happen on the cluster (no caller did it).
CLUSTER_USER, CLUSTER_ROLE = "ray-cluster", "cluster"


def by_cluster(
    session: Session, action: str, run_id: str | None = None, target: str | None = None
) -> None:
    """Record what the service saw happen on the cluster, outside any call to it."""
    record(
        session,
        entry(user=CLUSTER_USER, role=CLUSTER_ROLE, action=action, run_id=run_id, target=target),
    )


def page(
    session: Session, limit: int, before: int | None = None, run_id: str | None = None
) -> list[AuditEntry]:
    """Newest first; ``before`` is the last id of the previous page."""
    query = select(AuditEntry).order_by(AuditEntry.id.desc()).limit(limit)
    if before is not None:
        query = query.where(AuditEntry.id < before)
    if run_id:
        query = query.where(AuditEntry.run_id == run_id)
    return list(session.scalars(query))
