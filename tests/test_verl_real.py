"""verl's own fully async trainer, for real, under the service: the cpu-smoke preset on the
embedded local Ray head (CPU only), from POST /runs to SUCCEEDED, its console metrics under
verl's key names and its checkpoints.

Slow (a verl run is 1.5-10 minutes on two cores, most of it start-up), and it needs the trainer
stack (rlrun[verl-cpu], README): without it these fail, never skip. One run at a time per host
(``flock`` on a lock file), since one peaks near 11 GB.
"""

from __future__ import annotations

import fcntl
import json
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import RAY_PORT
from tests.service_process import ServiceProcess

pytestmark = [pytest.mark.slow, pytest.mark.ray, pytest.mark.timeout(1500)]

LOCK = Path("/tmp/rlrun-verl-real.lock")
RUN_TIMEOUT_S = 900
# The verl run view's charts (service/static/run.js) that verl 0.9.1 logs on this path.
CHARTED = {
    "critic/score/mean",
    "critic/score/max",
    "critic/score/min",
    "fully_async/trainer/idle_ratio",
    "fully_async/rollouter/idle_ratio",
    "fully_async/count/staleness_samples",
    "fully_async/count/stale_trajectory_processed",
    "fully_async/partial/partial_ratio",
    "timing_s/timing_s/param_sync",
    "fully_async/count/current_param_version",
}


@pytest.fixture(scope="module")
def smoke(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServiceProcess, Path]]:
    from jobs.verl_cpu import assets

    # Where the embedded nodes' own user (the service runs as root) reads data and writes
    # checkpoints: not in pytest's private temp dir.
    root = Path(tempfile.mkdtemp(prefix="rlrun-verl-real-"))
    root.chmod(0o755)
    (root / "checkpoints").mkdir()
    data = root / "data"
    assets.make(data / "rlrun-smoke")
    service = ServiceProcess("sqlite:///" + str(root / "db.sqlite"), "local", root / "s.log")
    service.env |= {
        # verl's actors ask for 23 CPUs beside the pools' bundles (logical: more than cores).
        "RLRUN_LOCAL_NPUS": "2",
        "RLRUN_LOCAL_CPUS_PER_NODE": "64",
        "RLRUN_LOCAL_RAY_STATE_DIR": str(root / "state"),
        # Ports of this session's range (conftest: RAY_PORT..RAY_PORT+2500), not random free ones
        # that another process may take between choosing and binding.
        "RLRUN_LOCAL_RAY_PORT": str(RAY_PORT + 2200),
        "RLRUN_LOCAL_DASHBOARD_PORT": str(RAY_PORT + 2300),
        "RLRUN_VERL_DATA_DIR": str(data),
        "RLRUN_VERL_MODEL_DIR": str(data),
        "RLRUN_VERL_CHECKPOINT_ROOT": str(root / "checkpoints"),
    }
    with LOCK.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        service.start(timeout=180)
        try:
            yield service, root
        finally:
            service.stop()
            shutil.rmtree(root, ignore_errors=True)


def _wait_end(http: httpx.Client, run_id: str) -> dict[str, Any]:
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while time.monotonic() < deadline:
        run: dict[str, Any] = http.get(f"/runs/{run_id}").json()
        if run["status"] in ("SUCCEEDED", "FAILED", "CANCELLED"):
            return run
        time.sleep(2)
    raise AssertionError(f"run {run_id} did not end in {RUN_TIMEOUT_S}s")


def test_cpu_smoke_trains_for_real_and_ends_succeeded(smoke: tuple[ServiceProcess, Path]) -> None:
    service, root = smoke
    with httpx.Client(base_url=service.url, timeout=30) as http:
        resp = http.post("/runs", json={"recipe": "verl-fully-async", "preset": "cpu-smoke",
                                        "name": "cpu-smoke"})  # fmt: skip
        assert resp.status_code in (200, 201, 202), resp.text
        run_id = resp.json()["id"]
        run = _wait_end(http, run_id)
        (root / "run.json").write_text(json.dumps(run, indent=2))
        assert run["status"] == "SUCCEEDED", json.dumps(run)[:3000]
        statuses = [e["to_status"] for e in run["events"]]
        assert statuses[0] == "QUEUED" and "RUNNING" in statuses and statuses[-1] == "SUCCEEDED"
        keys = set(http.get(f"/runs/{run_id}/metrics/keys").json())
    # verl's own key names, as the dashboard's verl charts draw them (a chart whose keys a run
    # never logs is not drawn: verl 0.9.1 logs no fully_async/count/mean_staleness).
    assert keys >= CHARTED, CHARTED - keys
    tree = root / "checkpoints" / run_id
    assert (tree / "latest_checkpointed_iteration.txt").read_text().strip() == "3"
    for step in (1, 2, 3):
        actor = tree / f"global_step_{step}" / "actor"
        assert (tree / f"global_step_{step}" / "data.pt").is_file()
        assert (actor / "model_world_size_1_rank_0.pt").is_file()
        assert (actor / "optim_world_size_1_rank_0.pt").is_file()
