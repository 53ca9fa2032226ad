"""A revoked token's open event streams end within a second: at once when this replica revoked
it, by the next check when another did (straight in the database, as another replica would)."""

from __future__ import annotations

import threading
import time
from typing import Any

import httpx
import pytest

from service.app import create_app
from service.store import tokens
from service.store.db import Database, upgrade
from tests.conftest import make_settings
from tests.live import ServerThread


class OpenStream:
    """``GET /runs/{id}/events`` read in a thread; ``ended`` is when the server closed it."""

    def __init__(self, url: str, token: str) -> None:
        self.url, self.token = url, token
        self.opened = threading.Event()
        self.ended_at: float | None = None
        self.done = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        headers = {"Authorization": f"Bearer {self.token}"}
        with httpx.stream("GET", self.url, headers=headers, timeout=httpx.Timeout(5, read=60)) as r:
            assert r.status_code == 200
            self.opened.set()
            for _ in r.iter_lines():
                pass
        self.ended_at = time.monotonic()
        self.done.set()


@pytest.fixture
def served(db_url: str) -> Any:
    upgrade(db_url)
    db = Database(db_url)
    with db.transaction() as s:
        watcher, watcher_secret = tokens.create(s, "watcher", "vision", "member")
        _, admin_secret = tokens.create(s, "ops", "vision", "admin")
    settings = make_settings(db_url, "http://127.0.0.1:9", run_loops=False, auth="on")
    with ServerThread(create_app(settings)) as url:
        auth = {"Authorization": f"Bearer {watcher_secret}"}
        made = httpx.post(f"{url}/runs", json={"recipe": "test-script"}, headers=auth)
        assert made.status_code == 201, made.text
        yield {
            "url": url,
            "events": f"{url}/runs/{made.json()['id']}/events",
            "token_id": watcher.id,
            "secret": watcher_secret,
            "admin": {"Authorization": f"Bearer {admin_secret}"},
            "db": db,
        }
    db.dispose()


def open_streams(served: dict[str, Any], n: int) -> list[OpenStream]:
    streams = [OpenStream(served["events"], served["secret"]) for _ in range(n)]
    for stream in streams:
        assert stream.opened.wait(30)
    time.sleep(0.3)  # each is past its replay, waiting for live items
    assert not any(s.done.is_set() for s in streams)
    return streams


def closed_within(streams: list[OpenStream], since: float) -> float:
    for stream in streams:
        assert stream.done.wait(10), "the stream stayed open"
    return max(s.ended_at or 0 for s in streams) - since


def test_revoking_through_the_api_ends_the_tokens_streams_at_once(served: dict[str, Any]) -> None:
    streams = open_streams(served, 2)
    started = time.monotonic()
    resp = httpx.delete(f"{served['url']}/tokens/{served['token_id']}", headers=served["admin"])
    assert resp.status_code == 200, resp.text
    took = closed_within(streams, started)
    assert took < 1.0, took
    again = httpx.get(served["events"], headers={"Authorization": f"Bearer {served['secret']}"})
    assert again.status_code == 401


def test_a_revocation_made_elsewhere_ends_the_streams_within_a_second(
    served: dict[str, Any],
) -> None:
    streams = open_streams(served, 2)
    started = time.monotonic()
    with served["db"].transaction() as s:  # as another replica would
        tokens.revoke(s, served["token_id"])
    took = closed_within(streams, started)
    assert took < 1.5, took  # one check every 0.5 s; margin for a loaded machine


def test_a_stream_whose_client_left_closes_its_source_and_leaves_no_task() -> None:
    """The request ends mid-stream (its client left) while the route's generator waits to hand
    over its next event, and is never closed: the broker's subscription is closed then and
    there all the same, and no waiter task is left pending."""
    import asyncio
    import contextlib
    from types import SimpleNamespace

    from service.api.auth import Principal
    from service.api.revocation import Revocations
    from service.api.run_metrics import _stream_items, run_events
    from service.metrics.broker import Cursor

    closed = asyncio.Event()

    async def subscription() -> Any:
        try:
            while True:
                yield SimpleNamespace(kind="metrics", data={"step": 1}), Cursor.parse(None)
                await asyncio.sleep(0)
        finally:
            closed.set()

    async def scenario() -> tuple[bool, int, int]:
        revocations = Revocations(poll_s=60)
        services = SimpleNamespace(
            broker=SimpleNamespace(subscribe=lambda *_: subscription()),
            revocations=revocations,
            db=None,
        )
        principal = Principal(user="u", team="t", role="member", token_id="tok-1")
        opened = contextlib.asynccontextmanager(_stream_items)
        request = opened(services, principal, "r1", Cursor.parse(None))  # type: ignore[arg-type]
        events = run_events(await request.__aenter__())
        await anext(events)  # one event handed over; the route waits to hand over the next
        await request.__aexit__(None, None, None)  # the request's end, as its exit stack does
        source_closed = closed.is_set()  # by the request's end, not by a task run later
        await revocations.close()
        others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        return source_closed, len(revocations._open), len(others)

    source_closed, open_tokens, tasks_left = asyncio.run(scenario())
    assert source_closed
    assert open_tokens == 0
    assert tasks_left == 0
