"""Failed sign-ins (an unknown or revoked API token, a JWT that does not verify) in the audit
trail, at most one row per source address per minute: a flood of bad tokens costs one write a
minute per address, not one per request. Each row's ``target`` says how many failures the
address had since its previous row (this one included) and the last reason. Counted in this
replica's memory; the row is written in a transaction of its own (the 401 does not wait on it
succeeding)."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

from service.store import audit
from service.store.db import Database

log = logging.getLogger(__name__)
WINDOW_S = 60.0
ACTION = "auth.failed"


@dataclass
class _Source:
    written_at: float
    unwritten: int = 0


class Folding:
    """Failures counted per source address (and what they were about), one row a minute due."""

    def __init__(self, window_s: float = WINDOW_S, max_sources: int = 10_000) -> None:
        self.window_s = window_s
        self.max_sources = max_sources
        self._sources: dict[str, _Source] = {}
        self._lock = threading.Lock()

    def count(self, client: str | None, about: str = "") -> int:
        """Count one failure from ``client`` (``host:port``) about ``about``: the failures its
        row is due to say, or 0 while the pair has a row in the last minute (nothing to write).
        Quick: it runs on the event loop."""
        address = f"{about}@{_address(client)}" if about else _address(client)
        now = time.monotonic()
        with self._lock:
            source = self._sources.get(address)
            if source is not None and now - source.written_at < self.window_s:
                source.unwritten += 1
                return 0
            if len(self._sources) >= self.max_sources:
                self._forget_old(now)
            self._sources[address] = _Source(now)
            return 1 + (source.unwritten if source is not None else 0)

    def _forget_old(self, now: float) -> None:
        for address, source in list(self._sources.items()):
            if now - source.written_at >= self.window_s:
                del self._sources[address]
        while len(self._sources) >= self.max_sources:
            self._sources.pop(next(iter(self._sources)))


class FailedSignIns(Folding):
    """Failed sign-ins, folded per address; a row due is written by ``write``."""

    def write(self, db: Database, client: str | None, reason: str, count: int) -> None:
        """The audit row of ``count`` failures from ``client`` (blocking: a write)."""
        try:
            with db.transaction() as session:
                audit.record(
                    session,
                    audit.entry(
                        user="unknown",
                        role="none",
                        action=ACTION,
                        client=client,
                        target=f"failures={count}; last: {reason}",
                    ),
                )
        except Exception as exc:  # the database busy or away: the refusal stands without it
            log.warning("could not record a failed sign-in from %s: %r", _address(client), exc)


def _address(client: str | None) -> str:
    return (client or "unknown").rsplit(":", 1)[0]
