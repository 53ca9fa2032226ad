"""The log tail against a websocket server that streams as Ray's does: it sends the log and never
reads its socket while the job runs (aiohttp, as Ray's dashboard), so it answers no close."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator

import pytest
from aiohttp import web

from service.cluster.log_tail import CLOSE_TIMEOUT_S, LogTail
from tests.conftest import wait_for
from tests.live import free_port


async def _stream(request: web.Request) -> web.WebSocketResponse:
    ws = web.WebSocketResponse()
    await ws.prepare(request)
    await ws.send_str("step:1 - reward:0.5\n")
    await asyncio.sleep(60)  # the job runs on; nothing is read
    return ws


@pytest.fixture
def ray_like() -> Iterator[str]:
    """The address of a server whose ``/api/jobs/{id}/logs/tail`` streams as above."""
    port = free_port()
    loop = asyncio.new_event_loop()
    app = web.Application()
    app.router.add_get("/api/jobs/{job}/logs/tail", _stream)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    loop.run_until_complete(runner.setup())
    loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", port).start())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{port}"
    asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)
    loop.close()


def test_letting_a_running_jobs_tail_go_does_not_wait_for_ray(ray_like: str) -> None:
    """The follower lets tails go at a handover and at shutdown, one after another on its
    thread: each close is bounded by ``CLOSE_TIMEOUT_S``, not websockets' 10 s."""
    tail = LogTail(ray_like, "job-1", 0)
    assert wait_for(tail.take, bool, timeout=10) == "step:1 - reward:0.5\n"
    started = time.monotonic()
    tail.close()
    took = time.monotonic() - started
    assert took < CLOSE_TIMEOUT_S + 3, took  # 10 s and more before
