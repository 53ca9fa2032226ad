"""What a write changed of the runs, told to the other replicas by PostgreSQL's ``NOTIFY``: a
replica drops the answers it keeps (``service/api/read_cache.py``) and forgets the tokens it
keeps signed in that were revoked (``service/api/token_cache.py``) when another replica's write
commits, usually within milliseconds, rather than when they lapse. ``read_cache_s`` stays the
bound: a notification can be lost with its listener's connection, and a listener that connects
again drops everything it keeps, since it may have missed some.

The notification is sent in the write's own transaction (``Database.before_commit``), so it is
delivered if and only if the write commits, after the commit: a replica that reads on being told
sees the write. Each replica ignores its own (it dropped them at its commit already).
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
from collections.abc import Callable
from typing import Any

import psycopg
from sqlalchemy import func, select
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session

from service.store.changes import Changes, RunChange

log = logging.getLogger(__name__)
CHANNEL = "rlrun_run_changes"
# PostgreSQL refuses a payload of 8,000 bytes or more: a bigger change is told as "everything".
MAX_PAYLOAD = 7_900
# Between a lost connection and the next attempt (doubling up to the last).
RETRY_S = (0.5, 1.0, 2.0, 5.0, 10.0)


def encode(changes: Changes, origin: str) -> str:
    """The notification's payload: who wrote, each run's change and the tokens revoked (or
    everything)."""
    if not changes.everything:
        doc: dict[str, Any] = {
            "o": origin,
            "r": {run_id: _doc(c) for run_id, c in changes.runs.items()},
        }
        if changes.tokens:
            doc["k"] = sorted(changes.tokens)
        text = json.dumps(doc, separators=(",", ":"))
        if len(text.encode()) <= MAX_PAYLOAD:
            return text
    return json.dumps({"o": origin, "e": True})


def decode(payload: str) -> tuple[str, Changes]:
    """Who wrote and what changed; a payload that cannot be read counts as everything."""
    try:
        doc = json.loads(payload)
        runs = {str(run_id): _change(c) for run_id, c in doc.get("r", {}).items()}
        tokens = {str(token_id) for token_id in doc.get("k", [])}
        return str(doc["o"]), Changes(runs=runs, everything=bool(doc.get("e")), tokens=tokens)
    except (ValueError, TypeError, KeyError, AttributeError):
        log.warning("a change notification could not be read: every kept answer is dropped")
        return "", Changes(everything=True)


def _doc(change: RunChange) -> dict[str, Any]:
    return {
        "c": sorted(change.columns),
        "i": change.inserted,
        "d": change.deleted,
        "v": change.events,
        "s": change.status,
        "t": change.team,
    }


def _change(doc: dict[str, Any]) -> RunChange:
    return RunChange(
        columns={str(c) for c in doc["c"]},
        inserted=bool(doc["i"]),
        deleted=bool(doc["d"]),
        events=bool(doc["v"]),
        status=doc["s"],
        team=doc["t"],
    )


class ChangeFeed:
    """This replica's side of the feed: ``publish`` in each write transaction, ``listen`` on
    the event loop for the others'. ``wanted``: which run changes are worth telling."""

    def __init__(self, url: str, wanted: Callable[[RunChange], bool]) -> None:
        self.origin = secrets.token_hex(8)
        self._wanted = wanted
        # psycopg's own connection string (never logged: it may hold a password).
        self._conninfo = make_url(url).set(drivername="postgresql").render_as_string(False)
        # Set while a LISTEN is in place (the app waits for it before its first request).
        self.listening = asyncio.Event()

    def publish(self, session: Session, changes: Changes) -> None:
        """Tell the other replicas, in the write's transaction (sent if it commits)."""
        runs = {run_id: c for run_id, c in changes.runs.items() if self._wanted(c)}
        if changes.everything or runs or changes.tokens:
            told = Changes(runs=runs, everything=changes.everything, tokens=changes.tokens)
            session.execute(select(func.pg_notify(CHANNEL, encode(told, self.origin))))

    async def listen(self, deliver: Callable[[Changes], None]) -> None:
        """Hand every other replica's change to ``deliver`` (on the loop) until cancelled; a
        lost connection is made again, and ``deliver`` told everything may have changed."""
        failures = 0
        while True:
            try:
                async with await psycopg.AsyncConnection.connect(
                    self._conninfo, autocommit=True
                ) as conn:
                    await conn.execute(f"LISTEN {CHANNEL}")
                    deliver(Changes(everything=True))  # what came while nobody listened
                    self.listening.set()
                    failures = 0
                    async for note in conn.notifies():
                        origin, changes = decode(note.payload)
                        if origin != self.origin:
                            deliver(changes)
            except (psycopg.Error, OSError) as exc:
                log.warning("the change feed is not listening (%s); retrying", type(exc).__name__)
            self.listening.clear()
            await asyncio.sleep(RETRY_S[min(failures, len(RETRY_S) - 1)])
            failures += 1
