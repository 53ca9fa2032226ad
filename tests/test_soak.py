"""No slow leaks: a thousand run lifecycles through one replica leave threads, file descriptors
and sockets where they were, hold nothing per run, and grow memory only within a bound
(tests/soak.py; 10,000 lifecycles: tests/benchmarks/bench_soak.py)."""

from __future__ import annotations

import gc
import logging
from pathlib import Path

import pytest

from service.settings import Settings
from tests.soak import soak

LIFECYCLES = 1000
# Measured at 1,000 lifecycles on a loaded 2-core machine: RSS +34 MB in a serial session, +55 MB
# in an xdist worker beside a verl run. Python's own heap grows by under 1 MB (tracemalloc) and
# SQLite's page cache is not it (the same growth with 100 KiB of cache per connection): the rest
# is native memory, not yet explained. The bound fails a leak of 64 KB or more per run; the goal
# (5 MB per 1,000) is not met yet.
RSS_GROWTH_MB = 64.0


@pytest.mark.slow
def test_a_thousand_lifecycles_leave_no_threads_descriptors_sockets_or_per_run_state(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="asyncio")
    figures = soak(LIFECYCLES, tmp_path)
    gc.collect()  # what was left to the collector (a stream never closed) is reported now
    before, after = figures["before"], figures["after"]
    assert figures["runs_done"] >= LIFECYCLES
    assert after.threads <= before.threads
    # AnyIO's request threads: the replica's pool grows with a burst up to request_threads
    # (pools of other event loops in this process stay as they were).
    assert after.workers <= before.workers + Settings().request_threads
    assert after.fds <= before.fds
    assert after.sockets <= before.sockets
    # Nothing is held per run once every run has ended and every client has left.
    assert figures["upstreams"] == 0
    assert figures["followed"] == 0
    assert after.rss_mb - before.rss_mb <= RSS_GROWTH_MB, figures
    # No task destroyed while pending, no generator closed while it ran.
    assert not [r.getMessage() for r in caplog.records if r.name == "asyncio"]
