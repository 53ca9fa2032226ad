"""Webhook delivery latency: from a run's status change to its receipt by a local receiver.

    PYTHONPATH=$PWD python -m tests.benchmarks.bench_webhooks [--runs 20] [--hooks 5] [--quick]

The service runs as deployed (``rlrun serve`` in its own process, its notifier loop at the
default ``RLRUN_WEBHOOK_INTERVAL_S``); this process changes the status of ``--runs`` runs
(QUEUED -> CANCELLED, in the database the service shares, spread over about two seconds) with
``--hooks`` subscriptions each hearing every change. The receiver verifies every message with
the ``standardwebhooks`` package; the latency of a message is its arrival minus the time of the
event it tells of (``data.event.at``, stamped in the transaction that wrote the outbox row).
Goal: p95 <= 2 s. ``--quick`` is SQLite only; the full run adds PostgreSQL.
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from datetime import datetime
from pathlib import Path

import httpx

from service import listeners
from service.store.db import Database, upgrade
from service.store.lifecycle import transition
from service.store.status import RunStatus
from tests import postgres
from tests.benchmarks.report import Report
from tests.factories import new_run
from tests.service_process import ServiceProcess
from tests.webhook_receiver import VerifyingReceiver


def measure(report: Report, label: str, db_url: str, workdir: Path, runs: int, hooks: int) -> None:
    upgrade(db_url)
    receiver = VerifyingReceiver()
    service = ServiceProcess(db_url, "http://127.0.0.1:9", workdir / f"{label}.log")
    service.env["RLRUN_WEBHOOK_ALLOW"] = "127.0.0.1/32"
    db = Database(db_url)
    try:
        service.start()
        for i in range(hooks):
            path = f"/h{i}"
            resp = httpx.post(
                f"{service.url}/webhooks",
                json={"url": receiver.url + path, "events": ["run.status"]},
                timeout=30,
            )
            resp.raise_for_status()
            receiver.secrets[path] = resp.json()["secret"]
        rng = random.Random(1)
        for n in range(runs):
            time.sleep(rng.uniform(0, 4 / runs))
            with db.transaction() as s:
                run = new_run(f"{label}-{n}", RunStatus.QUEUED)
                s.add(run)
                s.flush()
                transition(s, run, RunStatus.CANCELLED, "benchmark")
        expected = runs * hooks
        deadline = time.monotonic() + 120
        while len({c.webhook_id for c in receiver.taken()}) < expected:
            if time.monotonic() > deadline:
                raise SystemExit(f"{label}: {len(receiver.taken())} of {expected} arrived")
            time.sleep(0.05)
        first = {}
        for call in receiver.taken():
            first.setdefault(call.webhook_id, call)
        assert all(c.message is not None for c in first.values())
        latencies = sorted(
            c.at - datetime.fromisoformat(c.message["data"]["event"]["at"]).timestamp()  # type: ignore[index]
            for c in first.values()
        )
        p95 = latencies[max(0, round(0.95 * len(latencies)) - 1)]
        report.add(
            f"{label}: status change to receipt, {runs} runs x {hooks} subscriptions",
            f"p50 {statistics.median(latencies):.2f} s, p95 {p95:.2f} s, "
            f"max {latencies[-1]:.2f} s (goal p95 <= 2 s)",
        )
        report.add(
            f"{label}: messages that failed to verify",
            str(sum(c.message is None for c in receiver.calls)),
        )
    finally:
        service.stop()
        receiver.close()
        db.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--hooks", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="SQLite only (what CI runs)")
    parser.add_argument("--keep", action="store_true", help="keep the service's log and database")
    args = parser.parse_args()
    listeners.register()  # the lifecycle's listeners, as the service registers them at start
    report = Report("Webhook delivery latency")
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tempfile.mkdtemp()) if args.keep else Path(tmp)
        print(f"workdir: {workdir}")
        measure(report, "sqlite", f"sqlite:///{workdir}/rlrun.db", workdir, args.runs, args.hooks)
        if args.quick:
            report.skip("postgresql", "--quick")
        else:
            with postgres.admin_url() as admin, postgres.fresh_database(admin, "rlrun_bench") as pg:
                measure(report, "postgresql", pg, workdir, args.runs, args.hooks)
    report.print()


if __name__ == "__main__":
    main()
