"""A local Ray cluster with virtual NPUs, started and stopped by the handle that owns it.

Each node is one ``ray start --block`` process in its own session and temp dir; stopping the
handle stops exactly those nodes (``ray stop`` would kill every Ray process on the host).
Ports stay outside 10002-19999, which Ray reserves for its workers.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx


class LocalRayCluster:
    def __init__(
        self,
        npus_per_node: list[int],
        cpus_per_node: int = 16,
        base_dir: str | Path | None = None,
        port: int = 26379,
        dashboard_port: int = 28265,
    ) -> None:
        self.npus_per_node = npus_per_node
        self.cpus_per_node = cpus_per_node
        # Ray's socket paths must stay short; a temp dir under /tmp keeps them so.
        self._owns_dir = base_dir is None
        self.base_dir = Path(base_dir) if base_dir else Path(tempfile.mkdtemp(prefix="rlrun-ray-"))
        self.port = port
        self.dashboard_port = dashboard_port
        self._procs: list[subprocess.Popen[bytes]] = []

    @property
    def address(self) -> str:
        return f"http://127.0.0.1:{self.dashboard_port}"

    @property
    def gcs_address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _node_args(self, index: int) -> list[str]:
        temp_dir = (self.base_dir / f"node{index}").resolve()
        temp_dir.mkdir(parents=True, exist_ok=True)
        return [
            "--block",
            "--node-ip-address=127.0.0.1",
            f"--temp-dir={temp_dir}",
            f"--num-cpus={self.cpus_per_node}",
            f"--resources={json.dumps({'NPU': self.npus_per_node[index]})}",
            f"--dashboard-agent-listen-port={self.port + 10 + index}",
            f"--object-store-memory={256 * 1024 * 1024}",
            "--disable-usage-stats",
        ]

    def _spawn(self, args: list[str], index: int) -> None:
        ray = Path(sys.executable).with_name("ray")
        env = dict(os.environ)
        # Job drivers inherit this PATH, so `python3` in an entrypoint is this environment's.
        env["PATH"] = f"{ray.parent}{os.pathsep}{env.get('PATH', '')}"
        env.setdefault("RAY_DEDUP_LOGS", "0")
        # Per-node usage in /api/cluster_status (what admission reads) refreshes at this period
        # (Ray's default: 5 s); a freed node is then seen within about a second.
        env.setdefault("AUTOSCALER_UPDATE_INTERVAL_S", "1")
        log = open(self.base_dir / f"node{index}.log", "wb")  # noqa: SIM115 - owned by the child
        proc = subprocess.Popen(
            [str(ray), "start", *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
        log.close()
        self._procs.append(proc)

    def start(self, timeout_s: float = 90.0) -> LocalRayCluster:
        self.base_dir.mkdir(parents=True, exist_ok=True)
        head = [
            "--head",
            f"--port={self.port}",
            f"--ray-client-server-port={self.port + 1}",
            "--include-dashboard=true",
            "--dashboard-host=127.0.0.1",
            f"--dashboard-port={self.dashboard_port}",
        ]
        try:
            self._spawn([*head, *self._node_args(0)], 0)
            self._wait_dashboard(timeout_s)
            for index in range(1, len(self.npus_per_node)):
                self._spawn([f"--address={self.gcs_address}", *self._node_args(index)], index)
            self._wait_nodes(timeout_s)
        except BaseException:
            # A node that did start must not outlive the failed start, holding its ports.
            self.stop()
            raise
        return self

    def _wait_dashboard(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self._check_alive()
            try:
                if httpx.get(f"{self.address}/api/version", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise TimeoutError(f"Ray dashboard did not come up at {self.address}; see {self.base_dir}")

    def _wait_nodes(self, timeout_s: float) -> None:
        """Wait until every node reports its NPUs to the head."""
        want = sum(self.npus_per_node)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self._check_alive()
            try:
                status = httpx.get(f"{self.address}/api/cluster_status", timeout=5).json()
                usage = status["data"]["clusterStatus"]["loadMetricsReport"]["usageByNode"]
                have = sum(r.get("NPU", [0, 0])[1] for r in usage.values())
                if len(usage) == len(self.npus_per_node) and have == want:
                    return
            except (httpx.HTTPError, KeyError, TypeError, ValueError):
                pass
            time.sleep(0.5)
        raise TimeoutError(f"Ray nodes did not all join; see {self.base_dir}")

    def _check_alive(self) -> None:
        for proc in self._procs:
            if proc.poll() is not None:
                raise RuntimeError(f"ray start exited with {proc.returncode}; see {self.base_dir}")

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop the nodes this handle started, workers first, then the head."""
        for proc in reversed(self._procs):
            _stop_group(proc, timeout_s)
        self._procs.clear()

    def cleanup(self) -> None:
        """Stop, and remove the temp dir if this handle made it."""
        self.stop()
        if self._owns_dir:
            shutil.rmtree(self.base_dir, ignore_errors=True)


def _stop_group(proc: subprocess.Popen[bytes], timeout_s: float) -> None:
    try:
        pgid = os.getpgid(proc.pid)
    except ProcessLookupError:
        return
    # SIGTERM to the blocking `ray start` makes it tear down its node's processes.
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    # Anything left in the node's session (raylet, workers) goes too.
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)
