"""Follower cost on one run that logs a lot; prints figures. Run from the repo root:

    PYTHONPATH=$PWD python tests/benchmarks/bench_follower.py [--mb 500] [--seconds 60] [--quick]

``--quick``: 2 MB over 2 s, then 3 s idle (what CI runs).

A synthetic Ray job on a local head writes ``--mb`` MB of log lines (one metric line in 100)
over ``--seconds`` s, then idles for 15 s. The follower follows it live, ticking every second,
until the run's log is read to the end; once with each reader, each in its own process:

- whole: the whole log fetched on every read (``GET /api/jobs/{id}/logs``), the known prefix
  dropped (how the follower read before);
- tail: Ray's log tail stream kept open, each read taking only what is new (the follower now).

For each: CPU seconds of the follower process, its peak RSS over its baseline, the CPU of a
read that finds nothing new once the log is long (the steady cost of a quiet run), the chars and
metric points stored (they must match), and how long after the job ended the log was all read.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from sqlalchemy import func, select

from service.cluster.ray_jobs import RayJobs
from service.loops.follower import Follower
from service.metrics.health import HealthRules
from service.metrics.log_readers import TailReader, WholeLogReader
from service.store.db import Database, upgrade
from service.store.models import MetricPoint, Run, RunLog, utcnow
from service.store.status import RunStatus
from tests.benchmarks.report import Report, ray_head
from tests.conftest import RAY_TOKENS
from tests.factories import add_run

# Prints ``mb`` MB in lines of 1,000 characters over ``seconds`` s, then a line a second for
# ``idle`` s.
JOB = """
import sys, time
mb, seconds, idle = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
pad = "x" * 960
lines_per_mb = 1000
start = time.time()
for m in range(mb):
    chunk = []
    for i in range(lines_per_mb):
        n = m * lines_per_mb + i
        if n % 100 == 0:
            chunk.append(f"step:{n // 100} - bench/value:{n}\\n")
        else:
            chunk.append(f"{n:012d} {pad}\\n")
    sys.stdout.write("".join(chunk))
    sys.stdout.flush()
    delay = start + seconds * (m + 1) / mb - time.time()
    if delay > 0:
        time.sleep(delay)
for i in range(idle):
    print("idle", i, flush=True)
    time.sleep(1)
"""


def _rss_kb() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def child(mode: str, address: str, mb: int, seconds: float, idle: int) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="bench-follower-"))
    url = f"sqlite:///{tmp}/db.sqlite"
    upgrade(url)
    db = Database(url)
    ray = RayJobs(address, os.environ["RLRUN_RAY_TOKEN"], timeout_s=300)
    run_id = f"bench-{uuid.uuid4().hex[:12]}"  # the same length for both: the log holds it
    add_run(db, run_id)
    reader = WholeLogReader(ray) if mode == "whole" else TailReader(ray)
    follower = Follower(db, ray, "bench", 60, 8_000_000, HealthRules(), reader=reader)
    ray.submit(run_id, f"python3 -c '{JOB}' {mb} {seconds} {idle}", {}, {})
    baseline_kb = _rss_kb()
    usage = resource.getrusage(resource.RUSAGE_SELF)
    cpu0 = usage.ru_utime + usage.ru_stime
    ended_at: float | None = None
    ticks = 0
    idle: list[float] = []  # CPU of reads that found (almost) nothing new: the steady cost
    read = 0
    while True:
        started = time.monotonic()
        tick_cpu = time.process_time()
        follower.tick()
        ticks += 1
        with db.transaction() as s:
            runlog = s.get(RunLog, run_id)
            if runlog is not None and runlog.finished_at is not None:
                break
            if runlog is not None:
                if read > 1_000_000 and runlog.log_offset - read < 1000:
                    idle.append(time.process_time() - tick_cpu)
                read = runlog.log_offset
        if ended_at is None:
            info = ray.get(run_id)
            if info is not None and info.status in {"SUCCEEDED", "FAILED", "STOPPED"}:
                assert info.status == "SUCCEEDED", info
                ended_at = time.monotonic()
                with db.transaction() as s:  # what the reconciler does
                    run = s.get(Run, run_id)
                    assert run is not None
                    run.status, run.ended_at = RunStatus.SUCCEEDED, utcnow()
        time.sleep(max(0.0, 1.0 - (time.monotonic() - started)))
    done = time.monotonic()
    usage = resource.getrusage(resource.RUSAGE_SELF)
    with db.transaction() as s:
        chars = s.scalar(select(RunLog.log_offset).where(RunLog.run_id == run_id))
        points = s.scalar(select(func.count()).where(MetricPoint.run_id == run_id))
    if mode == "whole":  # its reads never found nothing new: take one more, at full size
        cpu = time.process_time()
        reader.read(run_id, chars or 0, None)
        idle.append(time.process_time() - cpu)
    follower.release()
    assert ended_at is not None
    return {
        "mode": mode,
        "cpu_s": round(usage.ru_utime + usage.ru_stime - cpu0, 1),
        "peak_rss_over_baseline_mb": round((usage.ru_maxrss - baseline_kb) / 1024),
        "ticks": ticks,
        "chars": chars,
        "points": points,
        "all_read_after_end_s": round(done - ended_at, 1),
        "cpu_per_idle_read_s": round(sum(idle) / len(idle), 3) if idle else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mb", type=int, default=500)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--idle", type=int, default=15)
    parser.add_argument("--quick", action="store_true", help="small, in seconds (what CI runs)")
    parser.add_argument("--child", choices=["whole", "tail"])
    parser.add_argument("--address")
    args = parser.parse_args()
    if args.quick:
        args.mb, args.seconds, args.idle = 2, 2.0, 3
    if args.child:
        print(json.dumps(child(args.child, args.address, args.mb, args.seconds, args.idle)))
        return
    results = []
    with ray_head([1], 2) as address:
        for mode in ("whole", "tail"):
            sizes = ["--mb", str(args.mb), "--seconds", str(args.seconds), "--idle", str(args.idle)]
            out = subprocess.run(
                [sys.executable, __file__, "--child", mode, "--address", address, *sizes],
                capture_output=True,
                text=True,
                check=True,
                env=os.environ | {"RLRUN_RAY_TOKEN": RAY_TOKENS.get(address, "")},
            ).stdout
            results.append(json.loads(out.strip().splitlines()[-1]))
            print(results[-1], flush=True)
    whole, tail = results
    assert whole["chars"] == tail["chars"] and whole["points"] == tail["points"]
    report = Report(f"follower, one run logging {args.mb} MB")
    report.add(
        "follower CPU, whole vs tail",
        f"{whole['cpu_s']} s vs {tail['cpu_s']} s "
        f"({whole['cpu_s'] / max(tail['cpu_s'], 0.1):.1f}x)",
    )
    report.add(
        "peak RSS over baseline, whole vs tail",
        f"{whole['peak_rss_over_baseline_mb']} MB vs {tail['peak_rss_over_baseline_mb']} MB",
    )
    report.add(
        "CPU per read with nothing new, whole vs tail",
        f"{whole['cpu_per_idle_read_s']} s vs {tail['cpu_per_idle_read_s']} s",
    )
    report.print()


if __name__ == "__main__":
    main()
