"""The service's wall clock: timezone-aware UTC, as every stored and answered time is."""

from __future__ import annotations

from datetime import UTC, datetime


def utcnow() -> datetime:
    return datetime.now(UTC)
