"""SIGKILL the service at random moments while 50 runs are accepted and submitted.

After restarts, every accepted run must have reached Ray exactly once, and nothing else must
have: the run id is Ray's submission id, claims lapse, and retries find "already exists".
"""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import httpx
import pytest

from service.local_ray import LocalRayCluster
from service.ray_jobs import RayJobs
from tests.conftest import wait_for

pytestmark = [pytest.mark.ray, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[1]
N_RUNS = 50


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class ServiceProcess:
    """The real service in a child process, so it can die by SIGKILL."""

    def __init__(self, db_url: str, ray_address: str, log_path: Path) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = os.environ | {
            "PYTHONPATH": str(ROOT),
            "RLRUN_DATABASE_URL": db_url,
            "RLRUN_RAY_ADDRESS": ray_address,
            "RLRUN_RECIPE_PLUGINS": "tests.recipes:register",
            "RLRUN_SUBMIT_INTERVAL_S": "0.2",
            "RLRUN_RECONCILE_INTERVAL_S": "1",
            "RLRUN_CLAIM_TTL_S": "3",
            "RLRUN_SUBMIT_BATCH": "4",
        }
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None
        self.kills = 0

    def start(self) -> None:
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "uvicorn", "--factory", "service.app:create_app",
                 "--host", "127.0.0.1", "--port", str(self.port)],
                env=self.env, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
            )
        wait_for(self._ready, bool, timeout=60, every=0.1)

    def _ready(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            pytest.fail(f"service exited: {self.log_path.read_text()[-3000:]}")
        try:
            return httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        self.kills += 1

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(30)


def _accept_all(service: ServiceProcess, token: str, accepted: dict[str, str]) -> None:
    """A client that retries each POST with its Idempotency-Key until it gets an answer."""
    for i in range(N_RUNS):
        key = f"{token}-{i}"
        body = {"recipe": "test-script", "name": key}
        while True:
            try:
                resp = httpx.post(f"{service.url}/runs", json=body,
                                  headers={"Idempotency-Key": key}, timeout=5)
            except httpx.HTTPError:
                time.sleep(0.05)
                continue
            if resp.status_code == 201:
                accepted[key] = resp.json()["id"]
                break
            assert resp.status_code >= 500, resp.text
            time.sleep(0.05)


def test_sigkill_at_random_moments_loses_and_duplicates_nothing(
    db_url: str, ray_cluster: LocalRayCluster, ray: RayJobs, tmp_path: Path
) -> None:
    rng = random.Random(7)
    token = f"crash-{uuid.uuid4().hex[:8]}"
    service = ServiceProcess(db_url, ray_cluster.address, tmp_path / "service.log")
    accepted: dict[str, str] = {}
    client = threading.Thread(target=_accept_all, args=(service, token, accepted), daemon=True)
    service.start()
    client.start()
    try:
        # Kill while runs are being accepted, then while the last ones are being submitted.
        extra_kills = 3
        while client.is_alive() or extra_kills:
            time.sleep(rng.uniform(0.2, 1.2))
            service.kill()
            service.start()
            if not client.is_alive():
                extra_kills -= 1
        client.join()
        assert len(accepted) == N_RUNS

        def runs() -> list[dict[str, object]]:
            items: list[dict[str, object]] = httpx.get(
                f"{service.url}/runs", params={"limit": 200}, timeout=10
            ).json()["items"]
            return items

        stored = wait_for(runs, lambda rs: all(r["status"] != "QUEUED" for r in rs), timeout=180)
    finally:
        service.stop()

    assert service.kills >= 5
    assert {r["name"]: r["id"] for r in stored} == accepted
    on_ray = [j.submission_id for j in ray.list_jobs() if j.submission_id in accepted.values()]
    assert sorted(on_ray) == sorted(accepted.values())
    # Each run was recorded as submitted exactly once, whatever the number of attempts.
    service.start()
    try:
        for run_id in accepted.values():
            run = httpx.get(f"{service.url}/runs/{run_id}", timeout=10).json()
            moves = [e["to_status"] for e in run["events"]]
            assert moves.count("SUBMITTED") == 1, run
    finally:
        service.stop()
