"""Faults Ray throws at the service: a restarted head, and errors for one run.

Each test injects the fault for real (the head is stopped and started again; one run's reads get
a 500 or a timeout from a real request) and states what must hold afterwards.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable
from datetime import datetime
from functools import partial
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from service.app import create_app
from service.cluster.local_ray import LocalRayCluster
from service.cluster.ray_jobs import RayJobs
from tests.conftest import (
    RAY_PORT,
    TERMINAL,
    make_settings,
    submit,
    transitions,
    wait_for,
    wait_status,
)

pytestmark = [pytest.mark.ray, pytest.mark.slow]


def test_a_restarted_head_loses_running_runs_and_runs_the_queued_and_new_ones(
    tmp_path: Any,
) -> None:
    port = RAY_PORT + 200
    cluster = LocalRayCluster([4], cpus_per_node=4, port=port, dashboard_port=port + 2000)
    settings = make_settings(
        f"sqlite:///{tmp_path}/db.sqlite", cluster.address, ray_token=cluster.token
    )
    try:
        cluster.start()
        with TestClient(create_app(settings)) as client:
            running = submit(client, seconds=300, npus=2)
            wait_status(client, running, {"RUNNING"})
            queued = submit(client, seconds=1, npus=4)  # only 2 of 4 NPUs are free: it waits
            assert client.get(f"/runs/{queued}").json()["status"] == "QUEUED"
            cluster.stop()
            during = submit(client, seconds=1)  # accepted while the head is down
            cluster.start()
            restarted = time.monotonic()
            after = submit(client, seconds=1)
            lost = wait_status(client, running, TERMINAL, timeout=60)
            lost_after = time.monotonic() - restarted
            done = {
                r: wait_status(client, r, TERMINAL, timeout=90) for r in (queued, during, after)
            }
            recovered_after = time.monotonic() - restarted
        assert lost["status"] == "LOST"
        assert "no longer knows" in lost["events"][-1]["reason"]
        assert {r: run["status"] for r, run in done.items()} == dict.fromkeys(done, "SUCCEEDED")
        for run in done.values():
            assert transitions(run).count("SUBMITTED") == 1
        print(f"head restart: LOST after {lost_after:.1f}s, all runs done {recovered_after:.1f}s")
    finally:
        cluster.cleanup()
        assert not os.path.exists(cluster.base_dir)


class FaultyRay(RayJobs):
    """The real client, except that reads of chosen runs get a 500 or a real timeout."""

    faults: dict[str, str] = {}  # noqa: RUF012 - set by the test, read by the service's client
    attempts: dict[str, list[float]] = {}  # noqa: RUF012
    silent_port = 0

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        for run_id, fault in self.faults.items():
            if run_id in path:
                if path == f"/api/jobs/{run_id}":  # the reconciler's read
                    self.attempts.setdefault(run_id, []).append(time.monotonic())
                if fault == "500":
                    return httpx.Response(500, text="Internal Server Error: GCS call failed")
                # A listener that never answers: the read times out for real.
                path, kwargs["timeout"] = f"http://127.0.0.1:{self.silent_port}{path}", 0.5
        return super()._request(method, path, **kwargs)


def _ended_on_ray_ms(ray: RayJobs, run_id: str) -> int:
    info = ray.get(run_id)
    assert info is not None and info.end_time_ms is not None
    return info.end_time_ms


def test_one_run_that_ray_fails_to_report_holds_up_no_other(
    service_factory: Callable[..., TestClient],
    tmp_path: Any,
    ray: RayJobs,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("service.cluster.registry.RayJobs", FaultyRay)
    monkeypatch.setattr(FaultyRay, "faults", {})
    monkeypatch.setattr(FaultyRay, "attempts", {})
    silent = socket.create_server(("127.0.0.1", 0))
    monkeypatch.setattr(FaultyRay, "silent_port", silent.getsockname()[1])
    with service_factory(f"sqlite:///{tmp_path}/db.sqlite") as client:
        bad = {"500": submit(client, seconds=4), "timeout": submit(client, seconds=4)}
        for run_id in bad.values():
            wait_status(client, run_id, {"RUNNING"})
        FaultyRay.faults.update({run_id: fault for fault, run_id in bad.items()})
        good = [submit(client, seconds=1) for _ in range(3)]
        for run_id in good:
            run = wait_status(client, run_id, TERMINAL, timeout=60)
            assert run["status"] == "SUCCEEDED"
            # Ended within a few rounds of Ray ending it: the reconciler's, and the follower's
            # final read of the log (a success waits for it, 2 s after Ray's word, and then
            # for the follower's next round).
            lag = datetime.fromisoformat(run["ended_at"]).timestamp() * 1000 - _ended_on_ray_ms(
                ray, run_id
            )
            assert lag < 10_000, lag
            print(f"one run failing on Ray: a healthy run seen ended {lag:.0f} ms after Ray")
        # The failing runs say why, and are tried less and less often.
        for fault, run_id in bad.items():
            run = wait_for(
                partial(lambda r: client.get(f"/runs/{r}").json(), run_id),
                lambda r: (
                    r["health"]["status"] == "ray_error" and len(FaultyRay.attempts[r["id"]]) > 4
                ),
                timeout=20,
            )
            assert run["status"] == "RUNNING"
            assert ("500" if fault == "500" else "Timeout") in run["health"]["reason"]
            tries = FaultyRay.attempts[run_id]
            assert tries[-1] - tries[-2] > 3 * 0.3, tries
        # The fault clears: they are reconciled to their real end and their health recovers.
        FaultyRay.faults.clear()
        for run_id in bad.values():
            run = wait_status(client, run_id, TERMINAL, timeout=30)
            assert run["status"] == "SUCCEEDED"
            assert run["health"]["status"] == "ok"
    silent.close()
