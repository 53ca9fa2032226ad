"""Every benchmark script (``tests/benchmarks/*.py`` but their shared ``report.py``, found by
name, so a new one is included) runs in its ``--quick`` mode to the end and prints its table, so
none rots unseen.

The figures of a quick run mean nothing (small sizes, a loaded machine); the scripts' own runs
give them. Their Ray parts share the pytest session's cluster (``RLRUN_BENCH_RAY_ADDRESS``).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from service.cluster.local_ray import LocalRayCluster
from service.cluster.ray_jobs import RayJobs
from tests.benchmarks.report import SHARED_RAY, SHARED_RAY_TOKEN

ROOT = Path(__file__).resolve().parent.parent
# Every script: the benchmarks and the profile (``report.py`` is their shared module).
SCRIPTS = sorted(
    p for p in (ROOT / "tests" / "benchmarks").glob("*.py") if p.stem not in {"__init__", "report"}
)
# Seconds one quick run may take here (most take far less; the machine may be loaded).
TIMEOUT_S = 300
# A Markdown table: a row of cells, its rule, at least one more row.
TABLE = re.compile(r"^\|.*\|\n\|(?: *:?-+:? *\|)+\n\|.*\|$", re.MULTILINE)


def test_benchmarks_are_found_by_name() -> None:
    names = {p.stem for p in SCRIPTS}
    assert {
        "bench_metrics",
        "bench_metrics_peers",
        "bench_peers",
        "bench_admission_clusters",
        "profile_api",
    } <= names


def test_a_markdown_table_is_recognised_and_lines_alone_are_not() -> None:
    assert TABLE.search("x\n| a | b |\n| --- | ---: |\n| 1 | 2 |\n")
    assert not TABLE.search("ingest: 1 points/s\n| a | b |\n")


@pytest.mark.slow
@pytest.mark.parametrize("script", SCRIPTS, ids=[p.stem for p in SCRIPTS])
def test_each_benchmark_runs_in_quick_mode_and_prints_its_table(
    script: Path, ray_cluster: LocalRayCluster
) -> None:
    env = os.environ | {
        "PYTHONPATH": str(ROOT),
        SHARED_RAY: ray_cluster.address,
        SHARED_RAY_TOKEN: ray_cluster.token,
    }
    ray = RayJobs(ray_cluster.address, ray_cluster.token)
    before = {job.submission_id for job in ray.list_jobs()}
    try:
        done = subprocess.run(
            [sys.executable, "-m", f"tests.benchmarks.{script.stem}", "--quick"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
        )
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else exc.stdout or ""
        pytest.fail(f"{script.name} --quick took over {TIMEOUT_S} s; its output:\n{out[-3000:]}")
    finally:
        # The jobs it left (bench_peers' wait for a resource no node has) are stopped, without
        # waiting for Ray to settle them: none holds a resource the next script needs.
        for job in ray.list_jobs():
            if job.submission_id not in before and job.status in {"PENDING", "RUNNING"}:
                ray.stop(job.submission_id)
        ray.close()
    tail = f"stdout:\n{done.stdout[-3000:]}\nstderr:\n{done.stderr[-3000:]}"
    assert done.returncode == 0, tail
    assert TABLE.search(done.stdout), f"{script.name} --quick printed no table\n{tail}"
