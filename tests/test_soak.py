"""No slow leaks: a thousand run lifecycles through one replica leave threads, file descriptors
and sockets where they were, hold nothing per run, and grow memory only within a bound
(tests/soak.py; the figures at 10,000: tests/benchmarks/bench_soak.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.soak import soak

LIFECYCLES = 1000
# RSS may grow by what SQLite's page caches fill to as the database grows (bounded: the open
# connections x PRAGMA cache_size, computed by the soak) and by this much besides. Measured at
# 1,000 lifecycles on a loaded 2-core machine: 34 MB in all, of which 17.6 MB page cache and
# 16 MB besides; Python's own heap grows by under 1 MB (tracemalloc).
RSS_BESIDES_CACHE_MB = 25.0


@pytest.mark.slow
def test_a_thousand_lifecycles_leave_no_threads_descriptors_sockets_or_per_run_state(
    tmp_path: Path,
) -> None:
    figures = soak(LIFECYCLES, tmp_path)
    before, after = figures["before"], figures["after"]
    assert figures["runs_done"] >= LIFECYCLES
    assert after.threads <= before.threads
    assert after.fds <= before.fds
    assert after.sockets <= before.sockets
    # Nothing is held per run once every run has ended and every client has left.
    assert figures["upstreams"] == 0
    assert figures["followed"] == 0
    growth = after.rss_mb - before.rss_mb
    assert growth <= figures["sqlite_cache_mb"] + RSS_BESIDES_CACHE_MB, figures
