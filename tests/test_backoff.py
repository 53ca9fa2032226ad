"""One backoff rule for the loops, the reconciler's per-run retries and the client's streams."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from service import client as client_module
from service.backoff import Backoff
from service.client import Client
from service.loops.base import Loop


def test_the_delay_doubles_per_failure_up_to_its_cap() -> None:
    backoff = Backoff(0.5, 3.0)
    assert [backoff.delay(n) for n in range(5)] == [0.5, 1.0, 2.0, 3.0, 3.0]
    assert Backoff(0.0, 10.0).delay(7) == 0.0
    assert Backoff(1.0, 60.0).delay(10_000) == 60.0  # no overflow however long it fails


def test_a_failing_loop_waits_longer_after_each_failure() -> None:
    def tick() -> None:
        raise RuntimeError("down")

    loop = Loop("failing", tick, interval_s=0.05, max_backoff_s=0.4)

    async def run_for(seconds: float) -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(loop.run(stop))
        await asyncio.sleep(seconds)
        stop.set()
        await task

    asyncio.run(run_for(1.5))
    # Without backoff: about 30 ticks of 0.05 s; with it 0.1 + 0.2 + 0.4 + 0.4 ... about 5.
    assert 2 <= loop.ticks <= 12 and loop.failures == loop.ticks


def test_a_loop_cancelled_while_it_waits_leaves_no_waiter_pending() -> None:
    loop = Loop("idle", lambda: None, interval_s=60, max_backoff_s=60)

    async def cancel_while_waiting() -> int:
        task = asyncio.create_task(loop.run(asyncio.Event()))
        while loop.ticks == 0:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)  # now in its wait for the next tick
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return len(asyncio.all_tasks() - {asyncio.current_task()})

    assert asyncio.run(cancel_while_waiting()) == 0


def test_a_loop_closes_what_its_ticks_kept_open_once_it_stops_or_is_cancelled() -> None:
    closed: list[str] = []

    async def stop_and_cancel() -> None:
        stop = asyncio.Event()
        stopped = Loop("a", lambda: None, 60, 60, close=lambda: closed.append("a"))
        cancelled = Loop("b", lambda: None, 60, 60, close=lambda: closed.append("b"))
        tasks = [asyncio.create_task(stopped.run(stop)), asyncio.create_task(cancelled.run(stop))]
        while stopped.ticks == 0 or cancelled.ticks == 0:
            await asyncio.sleep(0.01)
        assert closed == []
        tasks[1].cancel()
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)

    asyncio.run(stop_and_cancel())
    assert sorted(closed) == ["a", "b"]


def test_a_stream_that_cannot_connect_retries_later_each_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    slept: list[float] = []
    monkeypatch.setattr(client_module.time, "sleep", slept.append)
    calls = 0

    def handler(request: httpx.Request) -> httpx.Response:
        nonlocal calls
        calls += 1
        if calls <= 4:
            raise httpx.ConnectError("refused")
        body = b"event: end\nid: 1-0\ndata: {}\n\n"
        return httpx.Response(200, content=body, headers={"content-type": "text/event-stream"})

    client = Client(url="http://svc", transport=httpx.MockTransport(handler))
    started = time.monotonic()
    events = list(client.events("r1", retry_s=0.5, max_retry_s=3.0))
    assert [e.kind for e in events] == ["end"]
    assert slept == [1.0, 2.0, 3.0, 3.0]
    assert time.monotonic() - started < 5  # the sleeps were recorded, not slept
