"""A crowd of API clients for the load suite and the probe benchmark: each client loops over a
mix of calls (submit, read, list, metrics, cancel, live events) and every answer is checked
against the contract (a 2xx, a 409 for cancelling an ended run, or a 429/503 with Retry-After,
within ``BOUND_S``)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp

SPEC = {"recipe": "test-script", "name": "load"}
# No request may wait longer than this for its answer (streams: for their headers).
BOUND_S = 15.0


@dataclass
class Tally:
    """What the clients saw: latencies, statuses per action, and answers outside the contract."""

    latencies: list[float] = field(default_factory=list)
    statuses: Counter[tuple[str, int]] = field(default_factory=Counter)
    bad: list[str] = field(default_factory=list)
    accepted: set[str] = field(default_factory=set)
    known: list[str] = field(default_factory=list)
    stopping: bool = False
    by_action: dict[str, list[float]] = field(default_factory=dict)

    def answer(self, action: str, status: int, headers: Any, took: float, text: str = "") -> None:
        self.statuses[action, status] += 1
        self.latencies.append(took)
        self.by_action.setdefault(action, []).append(took)
        busy = status in (429, 503)
        if busy and "Retry-After" not in headers:
            self.bad.append(f"{action}: {status} without Retry-After")
        elif not (200 <= status < 300 or busy or (action == "cancel" and status == 409)):
            self.bad.append(f"{action}: {status} {text[:200]}")
        if took > BOUND_S:
            self.bad.append(f"{action}: answered after {took:.1f} s")

    def failed(self, action: str, exc: BaseException) -> None:
        if not self.stopping:
            self.bad.append(f"{action}: {exc!r}")


def _pick(rng: random.Random, run_id: str) -> tuple[str, str, str, Any]:
    """The next request of a client: (action, method, path, json body)."""
    pick = rng.random()
    if pick < 0.15:
        return "post", "POST", "/runs", SPEC
    if pick < 0.60:
        return "get", "GET", f"/runs/{run_id}", None
    if pick < 0.75:
        return "list", "GET", "/runs?limit=20", None
    if pick < 0.85:
        return "metrics", "GET", f"/runs/{run_id}/metrics", None
    if pick < 0.92:
        return "cancel", "POST", f"/runs/{run_id}/cancel", None
    return "events", "GET", f"/runs/{run_id}/events", None


async def _client(http: aiohttp.ClientSession, tally: Tally, rng: random.Random) -> None:
    while not tally.stopping:
        await asyncio.sleep(rng.uniform(0, 0.1))
        action, method, path, body = _pick(rng, rng.choice(tally.known))
        t0 = time.perf_counter()
        try:
            async with http.request(method, path, json=body) as resp:
                took = time.perf_counter() - t0
                if action == "events" and resp.status == 200:
                    # Read the live stream for a while (or to its end), then leave.
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(rng.uniform(0.5, 3)):
                            async for _line in resp.content:
                                pass
                    text = ""
                else:
                    text = await resp.text()
                    took = time.perf_counter() - t0
                tally.answer(action, resp.status, resp.headers, took, text)
                if resp.status in (429, 503):
                    await asyncio.sleep(float(resp.headers.get("Retry-After", 1)))
                if action == "post" and resp.status == 201:
                    run_id = json.loads(text)["id"]
                    tally.accepted.add(run_id)
                    tally.known.append(run_id)
        except (aiohttp.ClientError, TimeoutError) as exc:
            tally.failed(action, exc)


async def flood(
    url: str,
    tally: Tally,
    clients: int,
    seconds: float,
    at_end: Callable[[], Awaitable[float]] | None = None,
) -> float:
    """Drive the service at ``url`` with ``clients`` clients for ``seconds``; then, with the
    clients still going, await ``at_end`` (e.g. a SIGTERM and the exit); its result, or 0."""
    timeout = aiohttp.ClientTimeout(sock_connect=BOUND_S, sock_read=BOUND_S)
    connector = aiohttp.TCPConnector(limit=clients + 50)
    async with aiohttp.ClientSession(url, timeout=timeout, connector=connector) as http:
        for _ in range(20):
            async with http.post("/runs", json=SPEC) as resp:
                run_id = (await resp.json())["id"]
                tally.accepted.add(run_id)
                tally.known.append(run_id)
        tasks = [
            asyncio.create_task(_client(http, tally, random.Random(i))) for i in range(clients)
        ]
        await asyncio.sleep(seconds)
        result = 0.0
        if at_end is not None:
            tally.stopping = True
            result = await at_end()
        tally.stopping = True
        await asyncio.gather(*tasks, return_exceptions=True)
    return result


# ``GET /healthz`` every 0.2 s on each base URL argv[2:] until the time argv[1], from its own
# process (the load's client process is too busy to time it); prints, per URL, the latencies
# and failures as JSON.
_PROBE = """
import json, sys, time, httpx
until, urls = float(sys.argv[1]), sys.argv[2:]
seen = {url: {"latencies": [], "failures": []} for url in urls}
clients = {url: httpx.Client(base_url=url, timeout=5) for url in urls}
while time.time() < until:
    for url, http in clients.items():
        t0 = time.perf_counter()
        try:
            http.get("/healthz").raise_for_status()
            seen[url]["latencies"].append(time.perf_counter() - t0)
        except httpx.HTTPError as exc:
            seen[url]["failures"].append(repr(exc))
    time.sleep(0.2)
print(json.dumps(seen))
"""


class HealthProbe:
    """``/healthz`` on each of ``urls``, timed from a process of its own until ``until``."""

    def __init__(self, until: float, *urls: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _PROBE, str(until), *urls], stdout=subprocess.PIPE
        )

    def result(self) -> dict[str, dict[str, list[Any]]]:
        """Per URL: ``latencies`` (seconds) and ``failures``."""
        seen: dict[str, dict[str, list[Any]]] = json.loads(self.proc.communicate(timeout=60)[0])
        return seen


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))] if ordered else float("nan")


def loop_ticks(url: str) -> dict[str, float]:
    """The service's background loop tick counters, from its Prometheus text."""
    import httpx

    resp = httpx.get(f"{url}/metrics", timeout=BOUND_S)
    while resp.status_code == 503:
        time.sleep(float(resp.headers["Retry-After"]))
        resp = httpx.get(f"{url}/metrics", timeout=BOUND_S)
    prefix = 'rlrun_loop_ticks_total{loop="'
    return {
        line[len(prefix) :].split('"')[0]: float(line.rsplit(" ", 1)[1])
        for line in resp.text.splitlines()
        if line.startswith(prefix)
    }
