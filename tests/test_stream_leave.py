"""A live stream whose client leaves is closed at once, down to the broker's upstream, with the
garbage collector off: nothing of it waits for the collector, and asyncio reports no task
destroyed while pending and no generator closed while it runs."""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest

from service.api.revocation import until_set
from service.app import create_app
from service.metrics import store
from service.metrics.parse import MetricLine
from tests.conftest import make_settings
from tests.live import ServerThread
from tests.loadgen import SPEC


@pytest.fixture
def collector_off() -> Iterator[None]:
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def test_streams_whose_clients_leave_end_at_once_without_the_collector(
    db_url: str, collector_off: None, caplog: pytest.LogCaptureFixture
) -> None:
    app = create_app(make_settings(db_url, "http://127.0.0.1:9", run_loops=False))
    caplog.set_level(logging.ERROR, logger="asyncio")
    with ServerThread(app) as url:
        broker = app.state.services.broker
        # Accepted (its first status event is stored), never submitted: it never ends.
        run_id = httpx.post(f"{url}/runs", json=SPEC, timeout=10).json()["id"]
        for _ in range(5):
            with httpx.stream("GET", f"{url}/runs/{run_id}/events", timeout=10) as resp:
                assert resp.status_code == 200
                for line in resp.iter_lines():
                    if line.startswith("event:"):
                        break  # the client leaves while the stream waits for more
            deadline = time.monotonic() + 5
            while broker.upstreams and time.monotonic() < deadline:
                time.sleep(0.05)
            assert broker.upstreams == 0
    gc.enable()
    gc.collect()  # what the collector would have finished, it reports now
    problems = [r.getMessage() for r in caplog.records if r.name == "asyncio"]
    assert not problems, problems


def test_a_source_that_ends_as_its_stream_is_cancelled_leaves_no_unretrieved_error() -> None:
    """The source's last step (StopAsyncIteration) completes in the same turn of the loop as the
    stream's cancellation: its outcome is still retrieved, so asyncio reports nothing."""
    reported: list[dict[str, object]] = []

    async def main() -> None:
        asyncio.get_running_loop().set_exception_handler(lambda _loop, ctx: reported.append(ctx))
        ready = asyncio.Event()

        async def source() -> AsyncIterator[int]:
            await ready.wait()
            return
            yield  # an async generator that ends without an item

        async def consume() -> None:
            async for _ in until_set(asyncio.Event(), source()):
                pass

        task = asyncio.create_task(consume())
        await asyncio.sleep(0.01)  # the stream waits on its source's first step
        ready.set()  # the step ends first in the next turn ...
        task.cancel()  # ... and the stream is cancelled in the same turn
        with pytest.raises(asyncio.CancelledError):
            await task
        del task
        gc.collect()  # an unretrieved outcome is reported when its task is collected
        await asyncio.sleep(0)

    asyncio.run(main())
    assert [ctx["message"] for ctx in reported] == []


def test_a_stream_whose_client_leaves_mid_replay_ends_at_once_without_the_collector(
    db_url: str, collector_off: None, caplog: pytest.LogCaptureFixture
) -> None:
    """The client leaves while its stream replays more than it reads: the endpoint then waits
    to hand over its next event, not inside the broker, and is never closed; its subscription
    is closed all the same, when the request ends."""
    app = create_app(make_settings(db_url, "http://127.0.0.1:9", run_loops=False))
    caplog.set_level(logging.ERROR, logger="asyncio")
    with ServerThread(app) as url:
        services = app.state.services
        run_id = httpx.post(f"{url}/runs", json=SPEC, timeout=10).json()["id"]
        with services.db.transaction() as s:
            lines = [(100 * n, MetricLine(n, {"a": n / 7, "b": 1.0})) for n in range(1, 2001)]
            store.add_lines(s, run_id, lines)
        for _ in range(5):
            with httpx.stream("GET", f"{url}/runs/{run_id}/events", timeout=10) as resp:
                assert resp.status_code == 200
                for line in resp.iter_lines():
                    if line.startswith("event: metrics"):
                        break  # 2,000 lines to replay: the client leaves after the first
            deadline = time.monotonic() + 5
            while services.broker.upstreams and time.monotonic() < deadline:
                time.sleep(0.05)
            assert services.broker.upstreams == 0
    gc.enable()
    gc.collect()
    problems = [r.getMessage() for r in caplog.records if r.name == "asyncio"]
    assert not problems, problems
