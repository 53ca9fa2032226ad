"""POST /runs latency and throughput (16 concurrent clients), POST -> RUNNING, idle RSS.

    python -m tests.benchmarks.bench_api [--requests-per-client 50] [--pg URL] [--quick]

``--quick``: 3 requests per client and 1 run to RUNNING (what CI runs).

The service runs in a child process (uvicorn, one worker) exactly as deployed. Accept throughput
is measured with the background loops off, so it is the API and the database alone; POST ->
RUNNING is measured with the loops on against a local Ray head with virtual NPUs.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
import uuid
from pathlib import Path

import httpx
from sqlalchemy import create_engine, text

from tests.benchmarks.report import Report, ray_head
from tests.service_process import ServiceProcess

CLIENTS = 16


def _post_load(url: str, per_client: int) -> tuple[list[float], float]:
    latencies: list[float] = []
    lock = threading.Lock()

    def client() -> None:
        mine = []
        with httpx.Client(base_url=url, timeout=30) as http:
            for _ in range(per_client):
                t0 = time.perf_counter()
                resp = http.post("/runs", json={"recipe": "test-script", "name": "bench"})
                mine.append(time.perf_counter() - t0)
                assert resp.status_code == 201, resp.text
        with lock:
            latencies.extend(mine)

    threads = [threading.Thread(target=client) for _ in range(CLIENTS)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return latencies, time.perf_counter() - start


def _pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[int(q) - 1] * 1000


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def bench_accept(report: Report, name: str, db_url: str, per_client: int, workdir: Path) -> None:
    service = ServiceProcess(db_url, "http://127.0.0.1:9", workdir / f"{name}.log")
    service.env["RLRUN_RUN_LOOPS"] = "false"
    service.start()
    try:
        time.sleep(3)
        assert service.proc is not None
        idle = _rss_mib(service.proc.pid)
        _post_load(service.url, 5)  # warm up
        lat, wall = _post_load(service.url, per_client)
        report.add(
            f"{name} POST /runs x{len(lat)} with {CLIENTS} clients",
            f"p50 {_pct(lat, 50):.1f} ms, p99 {_pct(lat, 99):.1f} ms, {len(lat) / wall:.0f} req/s; "
            f"idle RSS {idle:.0f} MiB",
        )
    finally:
        service.stop()


def bench_post_to_running(report: Report, workdir: Path, runs: int = 10) -> None:
    with ray_head([8], 8) as address:
        _post_to_running(report, workdir, address, runs)


def _post_to_running(report: Report, workdir: Path, address: str, runs: int) -> None:
    service = ServiceProcess(f"sqlite:///{workdir}/ray.db", address, workdir / "ray.log")
    service.env["RLRUN_SUBMIT_INTERVAL_S"] = "1"
    service.env["RLRUN_RECONCILE_INTERVAL_S"] = "0.5"
    try:
        service.start()
        times = []
        with httpx.Client(base_url=service.url, timeout=30) as http:
            for _ in range(runs):
                t0 = time.perf_counter()
                run_id = http.post("/runs", json={"recipe": "test-script", "seconds": 2}).json()[
                    "id"
                ]
                while http.get(f"/runs/{run_id}").json()["status"] != "RUNNING":
                    time.sleep(0.02)
                times.append(time.perf_counter() - t0)
                while http.get(f"/runs/{run_id}").json()["status"] == "RUNNING":
                    time.sleep(0.1)
        report.add(
            f"POST -> RUNNING (reconcile every 0.5 s) over {runs} runs",
            f"median {statistics.median(times):.2f} s, max {max(times):.2f} s",
        )
    finally:
        service.stop()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests-per-client", type=int, default=50)
    parser.add_argument("--pg", default="postgresql+psycopg://postgres@127.0.0.1:5432/test")
    parser.add_argument("--quick", action="store_true", help="small, in seconds (what CI runs)")
    args = parser.parse_args()
    running = 10
    if args.quick:
        args.requests_per_client, running = 3, 1
    report = Report("accept (POST /runs)")
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        sqlite = f"sqlite:///{workdir}/bench.db"
        bench_accept(report, "sqlite", sqlite, args.requests_per_client, workdir)
        name = f"rlrun_bench_{uuid.uuid4().hex[:8]}"
        admin = create_engine(args.pg, isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
        try:
            url = args.pg.rsplit("/", 1)[0] + f"/{name}"
            bench_accept(report, "postgres", url, args.requests_per_client, workdir)
        finally:
            with admin.connect() as conn:
                conn.execute(text(f'DROP DATABASE "{name}" WITH (FORCE)'))
        bench_post_to_running(report, workdir, running)
    report.print()


if __name__ == "__main__":
    main()
