"""Liveness and readiness from a process of their own, which a flood of API calls cannot delay.

The API's event loop answers ``/healthz`` too, but under hundreds of clients a probe there waits
its turn for seconds (and a thread beside it still waits for the interpreter lock), so an
orchestrator would restart a service that is only busy. With ``RLRUN_PROBE_PORT`` set, the
service binds that port and hands the socket to a small child process that answers:

- ``GET /healthz``: 200 while the API's event loop turns. The loop stamps a heartbeat in shared
  memory every ``HEARTBEAT_S``; one older than ``stall_s`` (a loop blocked, not merely busy, or
  a service that died) is a 503.
- ``GET /readyz``: 200 when the database answers (the child's own connection), Ray reported
  apart; ``ok`` per check, never an error text (it would name hosts, ports and users).

The child reads its settings (the database URL, the Ray address and token) from its standard
input, never its command line or environment, and exits as soon as its parent is gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import mmap
import os
import select
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

from sqlalchemy import text

from service.cluster.ray_jobs import RayJobs, RayRejected, RayUnavailable
from service.store.db import Database

log = logging.getLogger(__name__)

HEARTBEAT_S = 0.25
READY_TIMEOUT_S = 30.0
_STAMP = struct.Struct("d")


def readiness(
    db: Database, rays: Mapping[str, RayJobs], details: bool = False
) -> tuple[bool, dict[str, Any]]:
    """Ready when the database answers: runs can be accepted (and queue) while Ray is away.
    Each cluster is reported apart: the first as ``ray``, any other as ``ray:<name>``, all
    asked at once. ``details`` adds the errors and Ray's version, which may name hosts, ports
    and users."""
    checks: dict[str, dict[str, Any]] = {}
    try:
        with db.read() as session:
            session.execute(text("SELECT 1"))
        checks["database"] = {"ok": True}
    except Exception as exc:
        checks["database"] = {"ok": False, "error": repr(exc)[:500]}

    def check(ray: RayJobs) -> dict[str, Any]:
        try:
            return {"ok": True, "version": ray.version().get("ray_version")}
        except (RayUnavailable, RayRejected) as exc:
            return {"ok": False, "error": str(exc)[:500]}

    names = list(rays)
    with ThreadPoolExecutor(max_workers=max(1, len(names))) as pool:
        answers = list(pool.map(check, rays.values()))
    for i, (name, answer) in enumerate(zip(names, answers, strict=True)):
        checks["ray" if i == 0 else f"ray:{name}"] = answer
    if not details:
        checks = {name: {"ok": check["ok"]} for name, check in checks.items()}
    return checks["database"]["ok"], checks


class ProbeProcess:
    """The probe listener: the socket bound here (so a taken port fails the start at once), the
    answering done by a child process, fed a heartbeat while the event loop turns."""

    def __init__(self, host: str, port: int, config: dict[str, Any]) -> None:
        self.sock = socket.create_server((host, port), reuse_port=False)
        self.port: int = self.sock.getsockname()[1]
        # The heartbeat: a stamp in an unnamed file both processes map.
        self.beat_file = tempfile.TemporaryFile()  # noqa: SIM115 (closed by close())
        self.beat_file.truncate(_STAMP.size)
        self.beat = mmap.mmap(self.beat_file.fileno(), _STAMP.size)
        self._stamp()
        fds = (self.sock.fileno(), self.beat_file.fileno())
        self.child = subprocess.Popen(
            [sys.executable, "-m", "service.api.probe_process", *map(str, fds)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            pass_fds=fds,
        )
        config = config | {"parent": os.getpid()}
        assert self.child.stdin is not None
        assert self.child.stdout is not None
        self.child.stdin.write(json.dumps(config).encode())
        self.child.stdin.close()
        self.sock.close()  # the child holds it now
        # Up only once its probes answer: a probe sent earlier would wait for the child's start.
        ready, _, _ = select.select([self.child.stdout], [], [], READY_TIMEOUT_S)
        if not ready or self.child.stdout.readline() != b"ready\n":
            self.close()
            raise RuntimeError("the probe listener's process did not start")
        log.info("probes (/healthz, /readyz) on port %d, process %d", self.port, self.child.pid)

    def _stamp(self) -> None:
        _STAMP.pack_into(self.beat, 0, time.monotonic())

    async def heartbeat(self, stop: asyncio.Event) -> None:
        """Stamp the heartbeat while the event loop turns, until ``stop``."""
        while not stop.is_set():
            self._stamp()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), HEARTBEAT_S)

    def close(self) -> None:
        self.child.terminate()
        try:
            self.child.wait(5)
        except subprocess.TimeoutExpired:
            self.child.kill()
            self.child.wait()
        self.beat.close()
        self.beat_file.close()


class _Handler(BaseHTTPRequestHandler):
    server_version = "rlrun-probe"
    sys_version = ""
    probes: _Probes

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/healthz":
            silent = self.probes.silent_s()
            if silent > self.probes.stall_s:
                self._answer(503, {"status": "stalled", "event_loop_silent_s": round(silent, 1)})
            else:
                self._answer(200, {"status": "ok"})
        elif path == "/readyz":
            ready, checks = readiness(self.probes.db, self.probes.rays)
            self._answer(200 if ready else 503, {"ready": ready, "checks": checks})
        else:
            self._answer(404, {"title": "Not Found", "status": 404})

    def _answer(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        """Probes come every few seconds: not worth a log line each."""


class _Probes:
    """What the child answers from: the heartbeat, its own database connection and Ray client."""

    def __init__(self, beat_fd: int, config: dict[str, Any]) -> None:
        self.stall_s: float = config["stall_s"]
        self.parent: int = config["parent"]
        self.beat = mmap.mmap(beat_fd, _STAMP.size, access=mmap.ACCESS_READ)
        self.db = Database(config["database_url"], wait_s=2.0, pool_size=1, max_overflow=0)
        self.rays = {
            name: RayJobs(address, token, timeout_s=2.0)
            for name, (address, token) in config["rays"].items()
        }

    def silent_s(self) -> float:
        stamped: float = _STAMP.unpack_from(self.beat, 0)[0]
        return time.monotonic() - stamped


class _Server(HTTPServer):
    def __init__(self, fd: int, probes: _Probes) -> None:
        self.probes = probes
        _Handler.probes = probes
        super().__init__(("127.0.0.1", 0), _Handler, bind_and_activate=False)
        self.socket.close()
        self.socket = socket.socket(fileno=fd)

    def service_actions(self) -> None:
        # Called between requests (every poll interval): leave as soon as the service is gone.
        if os.getppid() != self.probes.parent:
            raise SystemExit(0)


def _main() -> None:
    config = json.loads(sys.stdin.read())
    sock_fd, beat_fd = map(int, sys.argv[1:3])
    server = _Server(sock_fd, _Probes(beat_fd, config))
    print("ready", flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        server.serve_forever(poll_interval=0.5)


if __name__ == "__main__":
    _main()
