"""``/healthz`` while a crowd saturates the API: on the probe listener and on the API's port.

    PYTHONPATH=$PWD python tests/benchmarks/bench_probes.py [--clients 500] [--seconds 30]
    PYTHONPATH=$PWD python tests/benchmarks/bench_probes.py --quick

The real service (``rlrun serve`` in a child process, loops on, Ray unreachable so that only its
own path counts) on SQLite and on PostgreSQL, driven by the load suite's clients
(tests/loadgen.py: submit, read, list, metrics, cancel, live events). A process of its own
polls ``/healthz`` on both ports every 0.2 s. Prints p50, p99 and max per port, and the API's
own p99 and shed share beside them.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

from tests import postgres
from tests.loadgen import HealthProbe, Tally, flood, quantile
from tests.service_process import ServiceProcess


def measure(db_url: str, clients: int, seconds: float, workdir: Path) -> list[str]:
    service = ServiceProcess(db_url, "http://127.0.0.1:9", workdir / "service.log")
    tally = Tally()
    service.start()
    try:
        probe = HealthProbe(time.time() + seconds, service.probe_url, service.url)
        asyncio.run(flood(service.url, tally, clients, seconds))
        seen = probe.result()
    finally:
        service.stop()
    shed = sum(n for (_, status), n in tally.statuses.items() if status in (429, 503))
    rows = []
    for port, url in (("probe listener", service.probe_url), ("API port", service.url)):
        lat = seen[url]["latencies"]
        rows.append(
            f"| {db_url.split(':')[0].split('+')[0]} | {clients} | {port} | {len(lat)} | "
            f"{quantile(lat, 0.5) * 1000:.1f} ms | {quantile(lat, 0.99) * 1000:.1f} ms | "
            f"{max(lat, default=float('nan')) * 1000:.1f} ms | {len(seen[url]['failures'])} | "
            f"{quantile(tally.latencies, 0.99) * 1000:.0f} ms, "
            f"{shed / max(1, len(tally.latencies)):.0%} shed |"
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clients", type=int, default=500)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--quick", action="store_true", help="50 clients for 3 s per database")
    args = parser.parse_args()
    clients, seconds = (50, 3.0) if args.quick else (args.clients, args.seconds)
    rows: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        rows += measure(f"sqlite:///{tmp}/bench.db", clients, seconds, Path(tmp))
        with postgres.admin_url() as admin, postgres.fresh_database(admin, "rlrun_bench") as pg:
            rows += measure(pg, clients, seconds, Path(tmp))
    print(
        "| database | clients | /healthz on | probes | p50 | p99 | max | failed | API p99, shed |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
