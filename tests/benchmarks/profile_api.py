"""Where the time of a cold read and of an accept goes: the app in this process, every request
run on one thread (the worker-thread hand-overs made inline) under cProfile.

    python -m tests.benchmarks.profile_api [--quick] [--db sqlite,postgres] [--requests 500]
        [--top 20] [--auth] [--dump DIR]

Per database: ``GET /runs/{id}`` of distinct runs (each a miss: nothing is kept), ``GET /runs``
(a page of 50, a miss), ``POST /runs`` (tiny-grpo, as bench_peers sends it). Prints the CPU time
per request of this process without the profiler (the client's share included: httpx's ASGI
transport), the time per request under it, and the functions with the most time of their own,
then by cumulative time. The HTTP server (uvicorn) is left out: it costs every route the same.
``--auth`` sends an API token.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import pstats
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio.to_thread
import httpx
from sqlalchemy import Engine, event

from service.app import create_app
from service.metrics import store
from service.metrics.parse import MetricLine
from service.settings import Settings
from service.store import tokens
from tests.benchmarks.bench_metrics import databases

SPEC = {"recipe": "tiny-grpo", "name": "bench", "team": "bench"}
RUNS = 100
# A row per request profiled, printed as one table at the end.
SUMMARY: list[str] = []


async def _inline(func: Callable[..., Any], *args: Any, **_: Any) -> Any:
    return func(*args)


async def _profiled(
    engines: tuple[Engine, ...],
    label: str,
    requests: int,
    send: Callable[[int], Awaitable[httpx.Response]],
    top: int,
    dump: str | None = None,
) -> None:
    for i in range(min(20, requests)):  # warm: statement caches, imports
        await send(i)
    # CPU time (this process: client, app and driver, no database server) without the profiler,
    # and the statements sent (BEGIN and COMMIT included): what a loaded machine does not blur.
    sent: list[str] = []

    def count(_conn: Any, _cursor: Any, sql: str, *_: Any) -> None:
        sent.append(sql)

    for engine in engines:
        event.listen(engine, "before_cursor_execute", count)
    cpu = time.process_time()
    for i in range(requests):
        await send(i)
    cpu_us = (time.process_time() - cpu) / requests * 1e6
    for engine in engines:
        event.remove(engine, "before_cursor_execute", count)
    profile = cProfile.Profile()
    started = time.perf_counter()
    profile.enable()
    for i in range(requests):
        await send(i)
    profile.disable()
    elapsed = time.perf_counter() - started
    if dump:
        profile.dump_stats(f"{dump}/{label.replace('/', '_').replace(' ', '_')}.prof")
    calls = pstats.Stats(profile).total_calls / requests  # type: ignore[attr-defined]
    SUMMARY.append(f"| {label} | {cpu_us:,.0f} µs | {calls:,.0f} | {len(sent) / requests:.1f} |")
    print(
        f"\n## {label}: {cpu_us:,.0f} µs of CPU per request unprofiled, "
        f"{elapsed / requests * 1e6:,.0f} µs profiled; per request {calls:,.0f} function calls, "
        f"{len(sent) / requests:.1f} statements on its engines\n"
    )
    for order in ("tottime", "cumulative"):
        out = io.StringIO()
        pstats.Stats(profile, stream=out).sort_stats(order).print_stats(top)
        lines = out.getvalue().splitlines()
        start = next(i for i, line in enumerate(lines) if line.lstrip().startswith("ncalls"))
        print(f"by {order}:\n```")
        print("\n".join(line[:160] for line in lines[start : start + top + 1]))
        print("```")


async def profile_db(url: str, args: argparse.Namespace) -> None:
    settings = Settings(
        database_url=url,
        ray_address="http://127.0.0.1:9",
        run_loops=False,
        read_cache_s=0,
        auth="on" if args.auth else "off",
        runs_per_team_per_minute=0,
    )
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        db = app.state.services.db
        headers = {}
        if args.auth:
            with db.transaction() as s:
                _row, secret = tokens.create(s, "bench", "bench", "admin", "bench")
            headers["Authorization"] = f"Bearer {secret}"
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(
            transport=transport, base_url="http://127.0.0.1", headers=headers
        ) as http:
            ids = []
            for _ in range(RUNS):
                resp = await http.post("/runs", json=SPEC)
                assert resp.status_code == 201, resp.text
                ids.append(resp.json()["id"])
            keys = list(store.LATEST_KEYS)
            with db.transaction() as s:
                for run_id in ids:
                    lines = [(s_, MetricLine(s_, dict.fromkeys(keys, s_ / 7))) for s_ in range(5)]
                    store.add_lines(s, run_id, lines)

            async def get_run(i: int) -> httpx.Response:
                resp = await http.get(f"/runs/{ids[i % RUNS]}")
                assert resp.status_code == 200
                return resp

            async def list_runs(_i: int) -> httpx.Response:
                resp = await http.get("/runs")
                assert resp.status_code == 200
                return resp

            async def accept(_i: int) -> httpx.Response:
                resp = await http.post("/runs", json=SPEC)
                assert resp.status_code == 201, resp.text
                return resp

            await _profiled(
                db.engines,
                f"{args.db_label}: GET /runs/{{id}}",
                args.requests,
                get_run,
                args.top,
                args.dump,
            )
            await _profiled(
                db.engines,
                f"{args.db_label}: GET /runs",
                args.requests,
                list_runs,
                args.top,
                args.dump,
            )
            await _profiled(
                db.engines,
                f"{args.db_label}: POST /runs",
                args.requests,
                accept,
                args.top,
                args.dump,
            )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="a few requests, SQLite only")
    parser.add_argument("--db", default="sqlite,postgres")
    parser.add_argument("--requests", type=int, default=500)
    parser.add_argument("--top", type=int, default=20)
    parser.add_argument("--auth", action="store_true")
    parser.add_argument("--dump", help="a directory for the .prof files (pstats)")
    args = parser.parse_args()
    if args.quick:
        args.db, args.requests, args.top = "sqlite", 20, 5
    # Every hand-over to a worker thread runs inline: the profile sees the whole request.
    anyio.to_thread.run_sync = _inline  # type: ignore[assignment]
    with tempfile.TemporaryDirectory() as tmp, databases(Path(tmp)) as db_urls:
        for label, url in db_urls:
            if label in args.db.split(","):
                args.db_label = label
                asyncio.run(profile_db(url, args))
    print("\n| request | CPU per request (unprofiled) | function calls | statements |")
    print("| --- | ---: | ---: | ---: |")
    print("\n".join(SUMMARY))


if __name__ == "__main__":
    main()
