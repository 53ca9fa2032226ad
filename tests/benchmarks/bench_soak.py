"""Run lifecycles through one replica on the fake Ray: memory, threads, descriptors, sockets.

    PYTHONPATH=$PWD python tests/benchmarks/bench_soak.py [--lifecycles 10000] [--quick]

The soak of tests/soak.py (the real app in this process, loops on, runs accepted over HTTP in
waves of 100, live event streams attaching and leaving) at full size; prints the gauges every
tenth of the way and the growth at the end, beside the bound of SQLite's page caches.
``--quick``: one wave of 25 after two warm-up waves of 25 (what CI runs; tests/test_soak.py holds
a thousand to the bounds).
"""

from __future__ import annotations

import argparse
import logging
import tempfile
from pathlib import Path

from tests.benchmarks import report
from tests.soak import Gauges, soak


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lifecycles", type=int, default=10_000)
    parser.add_argument("--quick", action="store_true", help="25 lifecycles (one small wave)")
    args = parser.parse_args()
    n, size = (25, 25) if args.quick else (args.lifecycles, 100)
    logging.basicConfig(level=logging.ERROR)
    waves = -(-n // size)
    rows: list[list[object]] = []

    def progress(wave: int, g: Gauges) -> None:
        if wave % max(1, waves // 10) == 0 or wave == waves:
            rows.append([wave * size, f"{g.rss_mb:.1f}", g.threads, g.fds, g.sockets])
            print(f"{wave * size} lifecycles: RSS {g.rss_mb:.1f} MB", flush=True)

    tmp = Path(tempfile.mkdtemp(prefix="bench-soak-"))
    figures = soak(n, tmp, wave=size, progress=progress)
    before, after = figures["before"], figures["after"]
    print(
        f"\n{n} lifecycles in {figures['seconds']:.0f} s: RSS {before.rss_mb:.1f} -> "
        f"{after.rss_mb:.1f} MB (+{after.rss_mb - before.rss_mb:.1f}; SQLite page caches may "
        f"hold up to {figures['sqlite_cache_mb']:.1f}), threads {before.threads} -> "
        f"{after.threads}, descriptors {before.fds} -> {after.fds} (database files "
        f"{before.db_fds} -> {after.db_fds}), sockets {before.sockets} -> {after.sockets}; "
        f"held per run at the end: {figures['upstreams']:.0f} stream upstreams, "
        f"{figures['followed']:.0f} followed runs"
    )
    print(report.table(["lifecycles", "rss_mb", "threads", "fds", "sockets"], rows))


if __name__ == "__main__":
    main()
