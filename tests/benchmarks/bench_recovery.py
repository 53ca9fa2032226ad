"""How soon the service tells a hang and a short run, on an embedded Ray; prints figures:

    PYTHONPATH=$PWD python tests/benchmarks/bench_recovery.py [--runs 3] [--quick]

``--quick``: one run of each, the watchdog's wait and round cut to 2 s and 1 s (what CI runs:
its figures then say nothing of the defaults).

- hang: jobs outside the service hold 8 NPUs on one node and 4 on the other; a run's job then
  asks for an actor of 6 NPUs. Measured: from the job's start (Ray's ``start_time``) to the
  run's health ``unschedulable`` (its event), with the service's default settings (check after
  20 s without a step, a watchdog round every 10 s). The issue's bound: 60 s; before, only the
  stuck timeout (``RLRUN_STUCK_SILENT_S``, 1800 s) said anything.
- short run: a job that exits 0 after 3 of its 30 planned steps. Measured: from Ray's end of the
  job (``end_time``) to the run's end (FAILED ``ended_early``, one transition), the time the
  service takes to read the log to the end before it decides.
"""

from __future__ import annotations

import shlex
import statistics
import tempfile
import time
import uuid
from datetime import datetime
from typing import Any

from fastapi.testclient import TestClient

from service.app import create_app
from service.cluster.ray_jobs import RayJobs
from tests.benchmarks.report import Report, ray_head, runs_from_args
from tests.conftest import RAY_PORT, RAY_TOKENS, make_settings

SLEEP = shlex.join(["python3", "-c", "import time; time.sleep(600)"])


def _wait(fetch: Any, done: Any, timeout: float = 180.0) -> Any:
    deadline = time.monotonic() + timeout
    while not done(value := fetch()):
        if time.monotonic() > deadline:
            raise TimeoutError(f"last value: {value!r}")
        time.sleep(0.2)
    return value


def _event_at(run: dict[str, Any], prefix: str) -> float:
    event = next(e for e in run["events"] if e["reason"].startswith(prefix))
    return datetime.fromisoformat(event["at"]).timestamp()


def hang(client: TestClient, ray: RayJobs) -> float:
    tag = uuid.uuid4().hex[:8]
    grabs = [f"bench-grab-{n}-{tag}" for n in (8, 4)]
    for job, npus in zip(grabs, (8.0, 4.0), strict=True):
        ray.submit(job, SLEEP, {}, {}, entrypoint_resources={"NPU": npus})
    _wait(
        lambda: [ray.get(j) for j in grabs], lambda js: all(j and j.status == "RUNNING" for j in js)
    )
    try:
        spec = {"recipe": "test-script", "seconds": 300, "actor_npus": 6}
        run_id = client.post("/runs", json=spec).json()["id"]
        run = _wait(
            lambda: client.get(f"/runs/{run_id}").json(),
            lambda r: r["health"]["status"] == "unschedulable",
        )
        info = ray.get(run_id)
        assert info is not None and info.start_time_ms is not None
        client.post(f"/runs/{run_id}/cancel")
        return _event_at(run, "health unschedulable") - info.start_time_ms / 1000
    finally:
        for job in grabs:
            ray.stop(job)


def short_run(client: TestClient, ray: RayJobs) -> float:
    spec = {"recipe": "test-metrics", "seconds": 60, "every_s": 0.1, "steps": 3, "total_steps": 30}
    run_id = client.post("/runs", json=spec).json()["id"]
    run = _wait(lambda: client.get(f"/runs/{run_id}").json(), lambda r: r["status"] == "FAILED")
    assert run["failure"]["class"] == "ended_early", run["failure"]
    info = ray.get(run_id)
    assert info is not None and info.end_time_ms is not None
    return _event_at(run, "ended_early") - info.end_time_ms / 1000


def main() -> None:
    runs, quick = runs_from_args(__doc__, 3, "one run of each")
    report = Report("Hangs and short runs: how soon the service says so (embedded Ray)")
    with ray_head([8, 8], 8, RAY_PORT) as address, tempfile.TemporaryDirectory() as tmp:
        ray = RayJobs(address, RAY_TOKENS.get(address))
        # Quick: the hang is seen within seconds rather than the default's half minute.
        watchdog = {"unschedulable_after_s": 2.0, "watchdog_interval_s": 1.0} if quick else {}
        settings = make_settings(f"sqlite:///{tmp}/bench.db", address, **watchdog)
        with TestClient(create_app(settings)) as client:
            hangs = [hang(client, ray) for _ in range(runs)]
            shorts = [short_run(client, ray) for _ in range(runs)]
        ray.close()
    report.add(
        f"job start -> health unschedulable ({runs} runs)",
        f"median {statistics.median(hangs):.1f} s, max {max(hangs):.1f} s",
    )
    report.add(
        f"Ray's end -> run FAILED ended_early ({runs} runs)",
        f"median {statistics.median(shorts):.1f} s, max {max(shorts):.1f} s",
    )
    report.print()


if __name__ == "__main__":
    main()
