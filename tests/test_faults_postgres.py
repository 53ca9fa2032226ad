"""PostgreSQL unreachable for 20 s: the API says 503 with Retry-After, the loops back off and
resume, and every run accepted before or after goes on to the end.

The outage is real: the service reaches PostgreSQL through a TCP proxy that the test cuts (open
connections dropped, new ones refused) and restores; the shared server itself is untouched.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from fastapi.testclient import TestClient

from service.cluster.ray_jobs import RayJobs
from tests.conftest import TERMINAL, _truncate, transitions, wait_for, wait_status
from tests.live import free_port

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.postgres]

OUTAGE_S = 20.0
PROBLEM = "application/problem+json"


class CuttableProxy:
    """A TCP proxy on 127.0.0.1, in its own thread, that can be cut and restored."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = free_port()
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        threading.Thread(target=self._loop.run_forever, daemon=True).start()
        self.restore()

    def _call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(10)

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, asyncio.CancelledError):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        writer.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        self._writers |= {writer, up_writer}
        await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))

    async def _listen(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", self.port)

    async def _cut(self) -> None:
        assert self._server is not None
        self._server.close()  # new connections are refused
        for writer in self._writers:
            writer.transport.abort()  # open ones drop, as when the network goes
        self._writers.clear()

    def restore(self) -> None:
        self._call(self._listen())

    def cut(self) -> None:
        self._call(self._cut())

    def close(self) -> None:
        self.cut()
        self._loop.call_soon_threadsafe(self._loop.stop)


def test_postgres_away_for_20s_is_a_503_and_every_accepted_run_goes_on(
    pg_database: str, service_factory: Callable[..., TestClient], ray: RayJobs
) -> None:
    _truncate(pg_database)
    host = pg_database.rpartition("@")[2].partition("/")[0]
    proxy = CuttableProxy(int(host.rsplit(":", 1)[1]))
    url = pg_database.replace(host, f"127.0.0.1:{proxy.port}")
    try:
        with service_factory(url, claim_ttl_s=5.0) as client:
            loops = client.app.state.services.loops  # type: ignore[attr-defined]
            before = [
                client.post("/runs", json={"recipe": "test-script", "seconds": s}) for s in (1, 8)
            ]
            assert [r.status_code for r in before] == [201, 201]
            ids = [r.json()["id"] for r in before]
            wait_status(client, ids[1], {"RUNNING"})
            proxy.cut()
            cut_at = time.monotonic()
            answers = []
            while time.monotonic() - cut_at < OUTAGE_S:
                resp = client.post("/runs", json={"recipe": "test-script"})
                answers.append(resp)
                answers.append(client.get(f"/runs/{ids[0]}"))
                time.sleep(2)
            failures = {name: loop.failures for name, loop in loops.items()}
            proxy.restore()
            restored = time.monotonic()
            after = wait_for(
                lambda: client.post("/runs", json={"recipe": "test-script", "seconds": 1}),
                lambda r: r.status_code == 201,
                timeout=30,
            )
            first_201 = time.monotonic() - restored
            ids.append(after.json()["id"])
            done = [wait_status(client, i, TERMINAL, timeout=90) for i in ids]
            all_done = time.monotonic() - restored
            stored = client.get("/runs", params={"limit": 200}).json()["items"]
    finally:
        proxy.close()
    assert {r.status_code for r in answers} == {503}, [r.text for r in answers]
    for resp in answers:
        assert resp.headers["content-type"] == PROBLEM and int(resp.headers["retry-after"]) > 0
    assert failures["submitter"] > 0 and failures["reconciler"] > 0  # they backed off
    assert [r["status"] for r in done] == ["SUCCEEDED"] * 3
    for run in done:
        assert transitions(run).count("SUBMITTED") == 1
    assert sorted(r["id"] for r in stored) == sorted(ids)  # nothing lost, nothing extra
    on_ray = [j.submission_id for j in ray.list_jobs() if j.submission_id in ids]
    assert sorted(on_ray) == sorted(ids)
    print(f"postgres outage: first 201 {first_201:.1f}s after, all runs done {all_done:.1f}s after")
