"""Failed sign-ins (an unknown or revoked API token, a JWT that does not verify) in the audit
trail, folded so that no choice of source address floods it: at most one row a minute per
network (a /24 of IPv4, a /64 of IPv6: a caller on one host, or a job on loopback, picks any
address of its 127/8 or its /64, not another network), and at most ``rows_per_window`` rows a
minute in all; the failures past that cap are one row, "N more", written with the next failure
after the minute. Each row's ``target`` says how many failures the network had since its
previous row (this one included) and the last reason. Counted in this replica's memory; a row
is written in a transaction of its own (the 401 does not wait on it succeeding)."""

from __future__ import annotations

import ipaddress
import logging
import threading
import time
from dataclasses import dataclass

from service.store import audit
from service.store.db import Database

log = logging.getLogger(__name__)
WINDOW_S = 60.0
ACTION = "auth.failed"
# Rows of failed sign-ins a minute at most, over every network (then one "N more" row).
ROWS_PER_WINDOW = 20


@dataclass
class _Source:
    written_at: float
    unwritten: int = 0


class Folding:
    """Failures counted per key, one row a minute due per key."""

    def __init__(self, window_s: float = WINDOW_S, max_sources: int = 10_000) -> None:
        self.window_s = window_s
        self.max_sources = max_sources
        self._sources: dict[str, _Source] = {}
        self._lock = threading.Lock()

    def count(self, key: str) -> int:
        """Count one failure of ``key``: the failures its row is due to say, or 0 while the
        key has a row in the last minute (nothing to write). Quick: it runs on the event loop."""
        with self._lock:
            return self._count(key, time.monotonic())

    def _count(self, key: str, now: float) -> int:
        source = self._sources.get(key)
        if source is not None and now - source.written_at < self.window_s:
            source.unwritten += 1
            return 0
        if len(self._sources) >= self.max_sources:
            self._forget_old(now)
        self._sources[key] = _Source(now)
        return 1 + (source.unwritten if source is not None else 0)

    def _forget_old(self, now: float) -> None:
        for key, source in list(self._sources.items()):
            if now - source.written_at >= self.window_s:
                del self._sources[key]
        while len(self._sources) >= self.max_sources:
            self._sources.pop(next(iter(self._sources)))


@dataclass(frozen=True)
class Due:
    """The rows one failure makes due: its network's (``failures``: 0 for none) and, the first
    time after a minute in which the cap held some back, the one row of those (``more`` of them,
    from ``networks`` networks)."""

    failures: int = 0
    more: int = 0
    networks: int = 0

    def __bool__(self) -> bool:
        return bool(self.failures or self.more)


class FailedSignIns(Folding):
    """Failed sign-ins, folded per network and capped in all; a row due is written by ``write``."""

    def __init__(
        self,
        window_s: float = WINDOW_S,
        max_sources: int = 10_000,
        rows_per_window: int = ROWS_PER_WINDOW,
    ) -> None:
        super().__init__(window_s, max_sources)
        self.rows_per_window = rows_per_window
        self._window_at = -float("inf")
        self._rows = 0
        self._held = 0
        self._held_from: set[str] = set()

    def failed(self, client: str | None) -> Due:
        """Count one failure from ``client`` (``host:port``): the rows now due."""
        key = network(client)
        now = time.monotonic()
        with self._lock:
            more = networks = 0
            if now - self._window_at >= self.window_s:
                more, networks = self._held, len(self._held_from)
                self._window_at, self._rows, self._held = now, 0, 0
                self._held_from = set()
            source = self._sources.get(key)
            due_now = source is None or now - source.written_at >= self.window_s
            if due_now and self._rows >= self.rows_per_window:
                # Over the cap: held back for the "N more" row (its network's row is not due yet
                # either, so its next failure after the minute writes one).
                self._held += 1
                self._held_from.add(key)
                return Due(0, more, networks)
            failures = self._count(key, now)
            if failures:
                self._rows += 1
            return Due(failures, more, networks)

    def write(self, db: Database, client: str | None, reason: str, due: Due) -> None:
        """The audit rows ``due`` for a failure from ``client`` (blocking: a write)."""
        targets = []
        if due.more:
            targets.append(
                f"failures={due.more} more, from {due.networks} networks, past the cap of "
                f"{self.rows_per_window} rows a minute"
            )
        if due.failures:
            targets.append(f"failures={due.failures}; last: {reason}")
        try:
            with db.transaction() as session:
                for target in targets:
                    audit.record(
                        session,
                        audit.entry(
                            user="unknown", role="none", action=ACTION, client=client, target=target
                        ),
                    )
        except Exception as exc:  # the database busy or away: the refusal stands without it
            log.warning("could not record a failed sign-in from %s: %r", network(client), exc)


def network(client: str | None) -> str:
    """The network a failure is folded under: the /24 of an IPv4 address, the /64 of an IPv6
    one, the name of anything else (``testclient``)."""
    host = (client or "unknown").rsplit(":", 1)[0].strip("[]")
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return host
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    prefix = 24 if address.version == 4 else 64
    return str(ipaddress.ip_network(f"{address}/{prefix}", strict=False))
