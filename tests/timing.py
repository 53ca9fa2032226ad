"""Where a test session's time went: each test's lane, worker and wall-clock span, one JSON
line per test in ``$RLRUN_TEST_TIMES`` (every xdist worker appends to the same file), and a
summary of that file at the end of CI (``.ci/run``)::

    .venv/bin/python -m tests.timing FILE

prints each lane's wall time (its first test's start to its last test's end), the seconds its
tests took, and the ten slowest tests (setup, call and teardown together). The lanes are
``tests/conftest.py``'s: ``verl`` (the real verl runs), ``ray`` (the Ray modules, one worker
each) and ``rest``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

ENV = "RLRUN_TEST_TIMES"
_STARTS = pytest.StashKey[float]()


def lane(item: pytest.Item) -> str:
    """The lane ``pytest_collection_modifyitems`` put ``item`` in."""
    group = item.get_closest_marker("xdist_group")
    name = str(group.args[0]) if group is not None and group.args else ""
    if name == "verl":
        return "verl"
    return "ray" if name.startswith("ray-") else "rest"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
    started = time.time()
    try:
        return (yield)
    finally:
        if path := os.environ.get(ENV):
            line = {
                "test": item.nodeid,
                "lane": lane(item),
                "worker": os.environ.get("PYTEST_XDIST_WORKER", "gw0"),
                "start": started,
                "end": time.time(),
            }
            with open(path, "a", encoding="utf-8") as out:
                out.write(json.dumps(line) + "\n")


def summary(lines: list[dict[str, Any]], slowest: int = 10) -> str:
    """The lanes' wall times and busy seconds, each worker's, and the slowest tests."""
    if not lines:
        return "no test times recorded"
    out = [f"{'lane':<8} {'tests':>6} {'wall s':>8} {'busy s':>8}  workers"]
    by_lane: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for line in lines:
        by_lane[line["lane"]].append(line)
    for name in sorted(by_lane):
        rows = by_lane[name]
        wall = max(r["end"] for r in rows) - min(r["start"] for r in rows)
        busy = sum(r["end"] - r["start"] for r in rows)
        workers = ",".join(sorted({r["worker"] for r in rows}))
        out.append(f"{name:<8} {len(rows):>6} {wall:>8.0f} {busy:>8.0f}  {workers}")
    session = max(r["end"] for r in lines) - min(r["start"] for r in lines)
    out.append(f"{'session':<8} {len(lines):>6} {session:>8.0f}")
    for worker in sorted({r["worker"] for r in lines}):
        busy = sum(r["end"] - r["start"] for r in lines if r["worker"] == worker)
        out.append(f"worker {worker}: busy {busy:.0f} s")
    out.append(f"the {slowest} slowest tests:")
    for r in sorted(lines, key=lambda r: r["start"] - r["end"])[:slowest]:
        out.append(f"{r['end'] - r['start']:>8.1f} s  {r['lane']:<5} {r['test']}")
    return "\n".join(out)


def main() -> None:
    path = Path(sys.argv[1])
    text = path.read_text(encoding="utf-8") if path.exists() else ""
    print(summary([json.loads(line) for line in text.splitlines() if line.strip()]))


if __name__ == "__main__":
    main()
