"""Failure -> next attempt RUNNING: how long a run retried by policy (backoff 0) waits between
its job's end on Ray and its next attempt running, on a local Ray head, the loops at their
default intervals.

    PYTHONPATH=$PWD python -m tests.benchmarks.bench_retry [--runs 5] [--quick]

Each run is a job that fails with an actor death after 5 s; its policy retries
``actor_died`` once. Measured per run: Ray's end time of attempt 1's job to attempt 2's
RUNNING as the service recorded it (what a user waits), and the service's own view (attempt
1 ended, the run RETRYING, to attempt 2 RUNNING). The goal is at most 30 s.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from datetime import UTC, datetime

import httpx

from service.app import create_app
from service.cluster.ray_jobs import RayJobs
from tests.benchmarks import report
from tests.conftest import RAY_TOKENS, make_settings
from tests.live import ServerThread

RAY_PORT = int(os.environ.get("RLRUN_TEST_RAY_PORT", "20379")) + 400
DIES = "ray.exceptions.ActorDiedError: The actor died unexpectedly before finishing this task."
SPEC = {
    "recipe": "test-script",
    "seconds": 5.0,  # long enough for the reconciler to see attempt 2 RUNNING
    "exit_code": 1,
    "message": DIES,
    "retry": {"max_attempts": 2, "on": ["actor_died"], "backoff_s": 0},
}


def _at(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(UTC).timestamp()


def measure(address: str, runs: int) -> tuple[list[float], list[float]]:
    """(job end -> next RUNNING, attempt end -> next RUNNING) in seconds, per run."""
    ray = RayJobs(address, RAY_TOKENS.get(address))
    with tempfile.TemporaryDirectory() as tmp:
        settings = make_settings(
            f"sqlite:///{tmp}/bench.db",
            address,
            submit_interval_s=1.0,
            reconcile_interval_s=2.0,
            follow_interval_s=1.0,
        )
        from_job, from_failed = [], []
        with ServerThread(create_app(settings)) as url, httpx.Client(base_url=url) as http:
            for _ in range(runs):
                run_id = http.post("/runs", json=SPEC).json()["id"]
                deadline = time.monotonic() + 120
                while True:
                    run = http.get(f"/runs/{run_id}").json()
                    if run["attempt"] == 2 and run["status"] == "RUNNING":
                        break
                    if time.monotonic() > deadline:
                        raise SystemExit(f"attempt 2 of {run_id} never ran: {run['events']}")
                    time.sleep(0.05)
                first, second = run["attempts"]
                job = ray.get(run_id)
                assert job is not None and job.end_time_ms is not None
                running = _at(second["started_at"])
                from_job.append(running - job.end_time_ms / 1000)
                from_failed.append(running - _at(first["ended_at"]))
                http.post(f"/runs/{run_id}/cancel")
    ray.close()
    return from_job, from_failed


def main() -> None:
    runs, _ = report.runs_from_args(__doc__, 5, "one run")
    out = report.Report("Failure -> next attempt RUNNING (backoff 0, default loop intervals)")
    with report.ray_head([8], 4, RAY_PORT) as address:
        from_job, from_failed = measure(address, runs)
    out.add("runs", str(runs))
    out.add("job ended on Ray -> attempt 2 RUNNING, median", f"{statistics.median(from_job):.1f} s")
    out.add("job ended on Ray -> attempt 2 RUNNING, max", f"{max(from_job):.1f} s")
    out.add(
        "attempt 1 ended (RETRYING) -> attempt 2 RUNNING, median",
        f"{statistics.median(from_failed):.1f} s",
    )
    out.print()


if __name__ == "__main__":
    main()
