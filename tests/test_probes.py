"""Liveness and readiness: on their own listener apart from the API, and no details for anyone
but an admin."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient

from service.api.probe_process import _STAMP, ProbeProcess
from service.app import create_app
from service.store.db import Database
from service.store.tokens import create as create_token
from tests.conftest import make_settings, wait_for
from tests.live import free_port
from tests.service_process import ServiceProcess


def test_the_probe_listener_answers_liveness_and_readiness_on_its_own_port(db_url: str) -> None:
    port = free_port()
    settings = make_settings(db_url, "http://127.0.0.1:9", run_loops=False, probe_port=port)
    with TestClient(create_app(settings)), httpx.Client(base_url=f"http://127.0.0.1:{port}") as p:
        # The socket is bound before the app starts; the child answers once it has started.
        assert p.get("/healthz", timeout=30).json() == {"status": "ok"}
        ready = p.get("/readyz")
        assert ready.status_code == 200
        # Ray is unreachable: reported, but no error text (hosts, ports) on the probe port.
        assert ready.json() == {
            "ready": True,
            "checks": {"database": {"ok": True}, "ray": {"ok": False}},
        }
        assert p.get("/runs").status_code == 404
    # The listener goes with the app.
    try:
        httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1)
        raise AssertionError("the probe listener outlived the app")
    except httpx.ConnectError:
        pass


def test_liveness_fails_once_the_event_loop_has_been_silent_too_long(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/probe.db"
    config = {"database_url": url, "rays": {"default": ["http://127.0.0.1:9", None]}}
    probe = ProbeProcess("127.0.0.1", 0, config | {"stall_s": 5.0})
    try:
        health = f"http://127.0.0.1:{probe.port}/healthz"
        assert wait_for(lambda: _status(health), lambda s: s is not None, timeout=30) == 200
        # The loop stamps it every quarter second while it turns; this one stopped 6 s ago.
        _STAMP.pack_into(probe.beat, 0, time.monotonic() - 6)
        silent = httpx.get(health)
        assert silent.status_code == 503
        assert silent.json()["status"] == "stalled"
    finally:
        probe.close()


def _status(url: str) -> int | None:
    try:
        return httpx.get(url, timeout=2).status_code
    except httpx.TransportError:
        return None


@pytest.mark.slow
def test_the_probe_listener_goes_when_its_service_is_killed(tmp_path: Path) -> None:
    service = ServiceProcess(
        f"sqlite:///{tmp_path}/db.sqlite", "http://127.0.0.1:9", tmp_path / "log"
    )
    service.start()
    health = f"{service.probe_url}/healthz"
    try:
        assert wait_for(lambda: _status(health), lambda s: s is not None, timeout=30) == 200
        service.kill()
        # A probe that outlived its service would keep an orchestrator from restarting it.
        wait_for(lambda: _status(health), lambda s: s is None, timeout=10)
    finally:
        service.stop()


def test_readiness_details_are_for_admins_only(db_url: str) -> None:
    settings = make_settings(db_url, "http://127.0.0.1:9", run_loops=False, auth="on")
    with TestClient(create_app(settings)) as api:
        db = Database(db_url)
        with db.transaction() as s:
            _, admin = create_token(s, "root", "ops", "admin")
            _, member = create_token(s, "ann", "vision", "member")
        db.dispose()
        bodies = {
            who: api.get("/readyz", headers=headers).json()
            for who, headers in {
                "anonymous": {},
                "unknown": {"Authorization": "Bearer rlrun_nope"},
                "member": {"Authorization": f"Bearer {member}"},
                "admin": {"Authorization": f"Bearer {admin}"},
            }.items()
        }
    for who in ("anonymous", "unknown", "member"):
        assert bodies[who]["checks"]["ray"] == {"ok": False}, who
        assert "error" not in bodies[who]["checks"]["database"], who
    assert bodies["admin"]["checks"]["ray"]["ok"] is False
    assert "127.0.0.1:9" in bodies["admin"]["checks"]["ray"]["error"]
