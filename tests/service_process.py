"""The real service in a child process (uvicorn), for tests and benchmarks that kill or load it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.conftest import RAY_TOKENS, wait_for
from tests.live import free_port

ROOT = Path(__file__).resolve().parents[1]


class ServiceProcess:
    """The real service in a child process, so it can die by SIGKILL."""

    def __init__(self, db_url: str, ray_address: str, log_path: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        # Liveness and readiness on their own listener (service/api/probe_server.py).
        self.probe_url = f"http://127.0.0.1:{free_port()}"
        self.env = os.environ | {
            "PYTHONPATH": str(ROOT),
            "RLRUN_DATABASE_URL": db_url,
            "RLRUN_RAY_ADDRESS": ray_address,
            "RLRUN_RECIPE_PLUGINS": "tests.recipes:register",
            "RLRUN_SUBMIT_INTERVAL_S": "0.2",
            "RLRUN_RECONCILE_INTERVAL_S": "1",
            "RLRUN_CLAIM_TTL_S": "3",
            "RLRUN_SUBMIT_BATCH": "4",
            "RLRUN_PROBE_PORT": self.probe_url.rsplit(":", 1)[1],
            "RLRUN_INSTANCE": "test",  # one job user for every test's service (conftest's)
        }
        if ray_address in RAY_TOKENS:
            self.env["RLRUN_RAY_TOKEN"] = RAY_TOKENS[ray_address]
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None
        self.kills = 0

    def start(self, timeout: float = 120) -> None:
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                # As deployed: `rlrun serve`.
                [sys.executable, "-m", "service.cli", "serve", "--port", str(self.port)],
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=ROOT,
            )
        # One client for the whole wait: each new one loads the CA bundle (about 60 ms of CPU),
        # which, ten times a second, would compete with the very process being waited for.
        with httpx.Client(timeout=5) as http:
            wait_for(lambda: self._ready(http), bool, timeout=timeout, every=0.1)

    def _ready(self, http: httpx.Client) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            pytest.fail(f"service exited: {self.log_path.read_text()[-3000:]}")
        try:
            # A generous wait per call: on a loaded machine a process just started is slow to
            # get the CPU, and a call cut short only starts again from nothing.
            return http.get(f"{self.url}/healthz").status_code == 200
        except httpx.HTTPError:
            return False

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        self.kills += 1

    def stop(self) -> None:
        """SIGTERM, and SIGKILL if it has not exited within 30 s: never leave it running."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.kill()
