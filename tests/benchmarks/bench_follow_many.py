"""One replica following many running runs at once, with a live client on each; prints figures.
Run from the repo root:

    PYTHONPATH=$PWD python tests/benchmarks/bench_follow_many.py [--runs 50,100,250,500]
    PYTHONPATH=$PWD python tests/benchmarks/bench_follow_many.py --quick
    PYTHONPATH=$PWD python tests/benchmarks/bench_follow_many.py --replicas 2 --runs 1000 \
        --period 10 [--lease 15] [--quick]

For each N the service runs in a child process (``rlrun``'s app under uvicorn, loops on) on a
stand-in for Ray (``SyntheticRay``: N jobs RUNNING, each printing a verl-shaped metric line
every ``--period`` s, with its print time as the value ``bench/printed_at``, among non-metric
lines). The parent attaches one SSE client to ``/runs/{id}/events`` per run and measures over
``--seconds`` s: the service's CPU (% of one core, from /proc), its RSS, print → client latency
(p50, p95, max) of every metric event received, and the follower's time per tick (interval
included, from /metrics). What the service does per run is what it
does for a real job, less the tail stream's socket and thread (the stand-in has none).

``--replicas 2`` (a fresh database on the PostgreSQL the tests use): two service processes share
the runs through the follower leases, with clients on both; then one is killed (SIGKILL), the
time until the other holds all its runs is printed (bound: the lease), and every run is checked
to have been read exactly once (its kept copy is its log up to the stored offset, with one point
per value printed there).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.benchmarks import report

ROOT = Path(__file__).resolve().parents[2]
KEYS = [
    "actor/pg_loss",
    "actor/entropy",
    "actor/grad_norm",
    "actor/lr",
    "critic/score/mean",
    "critic/rewards/mean",
    "response_length/mean",
    "timing_s/gen",
    "timing_s/update_actor",
    "perf/throughput",
]


class SyntheticLogs:
    """Each job's log as a function of time: line ``k`` of a job is printed at ``start + phase +
    k * period`` (the phase spreads the jobs over the period), so every process that knows
    ``start`` sees the same log."""

    def __init__(self, start: float, period: float) -> None:
        self.start = start
        self.period = period
        self._logs: dict[str, tuple[int, str]] = {}
        self._lock = threading.Lock()

    def _phase(self, run_id: str) -> float:
        return (zlib.crc32(run_id.encode()) % 1000) / 1000 * self.period

    def line(self, run_id: str, k: int) -> str:
        printed = self.start + self._phase(run_id) + k * self.period
        values = " - ".join(f"{key}:{(k * 7 + i) % 13 / 10}" for i, key in enumerate(KEYS))
        return (
            f"(TaskRunner pid=4242) Training Progress: step {k}\n"
            f"(TaskRunner pid=4242) step:{k} - {values} - bench/printed_at:{printed:.3f}\n"
        )

    def log(self, run_id: str, now: float | None = None) -> str:
        now = time.time() if now is None else now
        upto = int((now - self.start - self._phase(run_id)) // self.period) + 1
        with self._lock:
            count, text = self._logs.get(run_id, (0, ""))
            if upto > count:
                text += "".join(self.line(run_id, k) for k in range(count, upto))
                self._logs[run_id] = (upto, text)
            return text


def serve(db_url: str, port: int, start: float, period: float) -> None:
    """The service (child process) on ``SyntheticRay``; runs until SIGTERM."""
    import uvicorn
    from sqlalchemy import select

    import service.cluster.registry
    from service.app import create_app
    from service.settings import Settings
    from service.store.db import Database
    from service.store.models import Run
    from tests.fake_ray import FakeRay

    logs = SyntheticLogs(start, period)

    class SyntheticRay(FakeRay):
        def logs(self, submission_id: str) -> str | None:
            return logs.log(submission_id) if submission_id in self.jobs else None

    ray = SyntheticRay({f"n{i}": {"NPU": 8.0, "CPU": 64.0} for i in range(8)})
    db = Database(db_url)
    with db.transaction() as s:
        for run_id in s.scalars(select(Run.id)):
            ray.set_status(run_id, "RUNNING")
    db.dispose()
    service.cluster.registry.RayJobs = lambda *_a, **_k: ray  # type: ignore[assignment,misc]
    settings = Settings(database_url=db_url, ray_address="http://127.0.0.1:9", auth="off")
    config = uvicorn.Config(create_app(settings), host="127.0.0.1", port=port, log_level="warning")
    uvicorn.Server(config).run()


def prepare(db_url: str, runs: int) -> list[str]:
    from service.store.db import Database, upgrade
    from tests.factories import add_run

    upgrade(db_url)
    db = Database(db_url)
    ids = [f"follow-{i:05d}" for i in range(runs)]
    for run_id in ids:
        add_run(db, run_id)
    db.dispose()
    return ids


class Service:
    def __init__(self, db_url: str, start: float, period: float) -> None:
        from tests.live import free_port

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        argv = [sys.executable, __file__, "--serve", db_url, "--port", str(self.port)]
        argv += ["--start", str(start), "--period", str(period)]
        env = os.environ | {"PYTHONPATH": str(ROOT)}
        self.proc = subprocess.Popen(argv, env=env, cwd=ROOT)
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the service did not start")
            time.sleep(0.2)

    def cpu_s(self) -> float:
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def rss_mb(self) -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return 0.0

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 30 s; nothing for a process that has exited already."""
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class Clients:
    """One SSE client per run; collects print → receive latencies of metric events."""

    def __init__(self, urls: list[str], run_ids: list[str]) -> None:
        self.urls = urls
        self.run_ids = run_ids
        self.latencies: list[float] = []
        self.attached: set[str] = set()
        self.measuring = False

    async def _follow(self, client: httpx.AsyncClient, i: int, run_id: str) -> None:
        base = self.urls[i % len(self.urls)]
        headers: dict[str, str] = {}
        while True:
            try:
                url = f"{base}/runs/{run_id}/events?since=now"
                async with client.stream("GET", url, headers=headers) as resp:
                    if resp.status_code != 200:
                        await asyncio.sleep(0.5)
                        continue
                    self.attached.add(run_id)
                    kind = ""
                    async for line in resp.aiter_lines():
                        if line.startswith("event:"):
                            kind = line[6:].strip()
                        elif line.startswith("id:"):
                            headers = {"Last-Event-ID": line[3:].strip()}
                        elif line.startswith("data:") and kind == "metrics":
                            printed = json.loads(line[5:])["values"].get("bench/printed_at")
                            if printed is not None and self.measuring:
                                self.latencies.append(time.time() - printed)
            except httpx.HTTPError:
                await asyncio.sleep(0.5)

    async def _followed(self) -> float:
        """The runs the replicas follow, together."""
        return sum([(await _gauges(url))["followed"] for url in self.urls])

    async def run(self, warmup_s: float, seconds: float, service: Service) -> dict[str, float]:
        limits = httpx.Limits(max_connections=len(self.run_ids) + 10)
        timeout = httpx.Timeout(10, read=120)
        async with httpx.AsyncClient(limits=limits, timeout=timeout) as client:
            tasks = [
                asyncio.create_task(self._follow(client, i, r)) for i, r in enumerate(self.run_ids)
            ]
            deadline = time.monotonic() + warmup_s + 60
            while len(self.attached) < len(self.run_ids) and time.monotonic() < deadline:
                await asyncio.sleep(0.2)
            # Every run followed before the warm-up: a run the follower takes on later (at most
            # RLRUN_FOLLOWER_CLAIM_NEW a tick) stores at once the lines printed before, which its
            # stream then carries late; that is start-up, not the steady state measured here.
            while await self._followed() < len(self.run_ids) and time.monotonic() < deadline:
                await asyncio.sleep(0.5)
            await asyncio.sleep(warmup_s)
            rss0, cpu0, t0 = service.rss_mb(), service.cpu_s(), time.monotonic()
            ticks0 = (await _gauges(service.url))["ticks"]
            self.measuring = True
            await asyncio.sleep(seconds)
            self.measuring = False
            cpu, elapsed = service.cpu_s() - cpu0, time.monotonic() - t0
            rss = service.rss_mb()
            ticks = (await _gauges(service.url))["ticks"] - ticks0
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        lat = sorted(self.latencies) or [float("nan")]
        return {
            "attached": len(self.attached),
            "cpu_pct": round(100 * cpu / elapsed),
            "events": len(self.latencies),
            "p50_s": round(statistics.median(lat), 2),
            "p95_s": round(lat[int(0.95 * (len(lat) - 1))], 2),
            "max_s": round(lat[-1], 2),
            "rss_mb": round(rss),
            "rss_growth_mb": round(rss - rss0),
            "tick_s": round(elapsed / ticks, 2) if ticks else float("inf"),
        }


async def _gauges(url: str) -> dict[str, float]:
    """The follower's ticks so far and the runs it follows, from the service's /metrics (on a
    connection of its own: the streams' client may have every connection in use)."""
    async with httpx.AsyncClient(timeout=30) as client:
        text = (await client.get(f"{url}/metrics")).text
    samples = {
        (s.name, s.labels.get("loop")): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    return {
        "ticks": samples[("rlrun_loop_ticks_total", "follower")],
        "followed": samples[("rlrun_followed_runs", None)],
    }


def one_replica(runs: int, period: float, warmup_s: float, seconds: float) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="bench-follow-many-"))
    db_url = f"sqlite:///{tmp}/db.sqlite"
    ids = prepare(db_url, runs)
    service = Service(db_url, time.time(), period)
    try:
        figures = asyncio.run(Clients([service.url], ids).run(warmup_s, seconds, service))
    finally:
        service.stop()
    return {"runs": runs} | figures


def _owners(db_url: str) -> dict[str | None, int]:
    from sqlalchemy import create_engine, func, select

    from service.store.models import RunLog

    engine = create_engine(db_url)
    with engine.connect() as conn:
        rows = conn.execute(
            select(RunLog.lease_owner, func.count()).group_by(RunLog.lease_owner)
        ).all()
    engine.dispose()
    return {owner: n for owner, n in rows}


def _read_once(db_url: str, logs: SyntheticLogs, ids: list[str]) -> int:
    """Runs whose stored copy and points are not exactly their log up to the stored offset."""
    from sqlalchemy import func, select

    from service.metrics import logcopy
    from service.store.db import Database
    from service.store.models import MetricPoint, RunLog

    db = Database(db_url)
    wrong = 0
    with db.read() as s:
        offsets = dict(s.execute(select(RunLog.run_id, RunLog.log_offset)).all())
        points = dict(
            s.execute(select(MetricPoint.run_id, func.count()).group_by(MetricPoint.run_id)).all()
        )
        for run_id in ids:
            text = logs.log(run_id)[: offsets[run_id]]
            lines = text.count("bench/printed_at:")
            if logcopy.tail(s, run_id, None) != text or points.get(run_id, 0) != lines * 11:
                wrong += 1
    db.dispose()
    return wrong


def two_replicas(runs: int, period: float, warmup_s: float, seconds: float, lease_s: float) -> None:
    """Two replicas on PostgreSQL share ``runs``; one is killed; its runs move to the other."""
    from tests import postgres

    with postgres.admin_url() as admin, postgres.fresh_database(admin, "bench_follow") as db_url:
        ids = prepare(db_url, runs)
        start = time.time()
        os.environ["RLRUN_FOLLOWER_LEASE_S"] = str(lease_s)
        # Unheld runs taken per tick: the replicas, started one after the other, share them.
        os.environ["RLRUN_FOLLOWER_CLAIM_NEW"] = str(max(1, runs // 10))
        replicas = [Service(db_url, start, period) for _ in range(2)]
        try:
            clients = Clients([r.url for r in replicas], ids)
            figures = asyncio.run(clients.run(warmup_s, seconds, replicas[0]))
            shared = _owners(db_url)
            # The replica holding the most runs dies (a lease owner names its process id).
            busiest = max((o for o in shared if o is not None), key=lambda o: shared[o])
            victim = next(r for r in replicas if f":{r.proc.pid}:" in busiest)
            victim.proc.kill()
            killed = time.monotonic()
            victim.proc.wait()
            while time.monotonic() - killed < 10 * lease_s:
                if list(_owners(db_url).values()) == [runs]:  # one owner holds every run
                    break
                time.sleep(0.2)
            handed_over_s = time.monotonic() - killed
            time.sleep(3)
            # The survivor stops first: a check beside a replica still storing would compare
            # offsets and copies read at different moments (each statement its own snapshot).
            for r in replicas:
                r.stop()
            wrong = _read_once(db_url, SyntheticLogs(start, period), ids)
        finally:
            for r in replicas:
                r.stop()
    print(
        f"two replicas, {runs} runs: leases split {sorted(shared.values())}; one replica "
        f"CPU {figures['cpu_pct']}%, p95 {figures['p95_s']} s (clients on both); the busiest "
        f"killed, its runs all held by the other after {handed_over_s:.1f} s (lease {lease_s} s); "
        f"runs not read exactly once: {wrong}"
    )
    print(
        report.table(
            ["replicas", "runs", "leases", "handed over", "read not exactly once"],
            [[2, runs, sorted(shared.values()), f"{handed_over_s:.1f} s", wrong]],
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", default="50,100,250,500")
    parser.add_argument("--period", type=float, default=1.0, help="s between a run's steps")
    parser.add_argument("--seconds", type=float, default=30.0, help="measured, per N")
    parser.add_argument("--warmup", type=float, default=10.0)
    parser.add_argument("--quick", action="store_true", help="20 runs for a few seconds")
    parser.add_argument("--replicas", type=int, default=1, choices=[1, 2])
    parser.add_argument("--lease", type=float, default=15.0, help="s, with --replicas 2")
    parser.add_argument("--serve")
    parser.add_argument("--port", type=int)
    parser.add_argument("--start", type=float)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve, args.port, args.start, args.period)
        return
    if args.quick:
        args.runs, args.seconds, args.warmup, args.lease = "20", 3.0, 2.0, 3.0
    if args.replicas == 2:
        for n in (int(x) for x in args.runs.split(",")):
            two_replicas(n, args.period, args.warmup, args.seconds, args.lease)
        return
    rows = []
    for n in (int(x) for x in args.runs.split(",")):
        rows.append(one_replica(n, args.period, args.warmup, args.seconds))
        print(rows[-1], flush=True)
    print(f"\nruns followed by one replica, a step a run every {args.period} s, one client each")
    header = ["runs", "cpu_pct", "p50_s", "p95_s", "max_s", "tick_s", "rss_mb", "events"]
    print(report.table(header, [[row[h] for h in header] for row in rows]))


if __name__ == "__main__":
    main()
