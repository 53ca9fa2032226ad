"""Retry and resume on the real local Ray head: tiny-grpo's trainer actor is SIGKILLed mid-run,
the policy starts attempt 2 as its own Ray job, which resumes from the last checkpoint and
succeeds, with one reward series and no step twice. No terminal status shows meanwhile: a
poller sees RETRYING beside attempt 1's FAILED, `rlrun status --follow` exits 0 and the
client's wait returns SUCCEEDED; then by hand, from checkpoint and from
scratch. The time from the kill to the next attempt RUNNING is measured (backoff 0). The run
page in Chromium, after attempt 2, is docs/dashboard-retry.png: the reward chart marks where
attempt 2 resumed."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from service.app import create_app
from service.client import Client
from service.cluster.local_ray import LocalRayCluster
from service.cluster.ray_jobs import RayJobs
from service.metrics.keys import REWARD_KEY
from service.store.status import TERMINAL
from service.wire.runs import RunOut
from tests.browser import shot, until
from tests.conftest import make_settings, wait_for, wait_status
from tests.live import ServerThread
from tests.recipes import retried_tiny_grpo

pytestmark = [pytest.mark.ray, pytest.mark.slow]

VERSIONS = 20
SPEC = retried_tiny_grpo("killed", VERSIONS, "actor_died")
_TRAINER_PID = re.compile(r"\(TinyGrpoTrainer pid=(\d+)")


def _steps(http: httpx.Client, run_id: str) -> list[int]:
    series = http.get(f"/runs/{run_id}/metrics", params={"keys": REWARD_KEY}).json()["series"]
    return [p["step"] for p in series.get(REWARD_KEY, [])]


def _ended_attempt(http: httpx.Client, run_id: str, n: int) -> dict[str, Any]:
    run: dict[str, Any] = wait_for(
        lambda: http.get(f"/runs/{run_id}").json(),
        lambda r: r["attempt"] == n and r["status"] in {"SUCCEEDED", "FAILED", "LOST"},
        timeout=180,
        every=0.5,
    )
    return run


def _shoot_the_resumed_run(tab: Any, url: str, run_id: str, resumed: int) -> None:
    """The run page once attempt 2 has succeeded: its charts (the reward chart marks the step
    attempt 2 resumed from) and its status timeline (the failure and the retry)."""
    tab.goto(f"{url}/ui/#/runs/{run_id}")
    reward = "document.querySelector(\"[data-chart='reward']\")"
    until(tab, f"{reward}.dataset.markers == 'attempt 2@{resumed}'")
    until(tab, f"{reward}.dataset.points == '{VERSIONS}'")
    until(tab, "document.querySelectorAll('#events li').length >= 6")
    tab.evaluate("new Promise((r) => requestAnimationFrame(() => requestAnimationFrame(r)))")
    box = tab.locator(".columns").bounding_box()
    clip = {"x": 0, "y": 0, "width": 1400, "height": box["y"] + box["height"] + 16}
    shot(tab, "dashboard-retry.png", clip=clip)
    # Left, so that its live stream does not try to reconnect to the service once it stops.
    tab.goto("about:blank")


# The database's part of a retry is tested on both (test_retry.py, test_crash_safety.py); the
# training, the kill and the resume on Ray, once.
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_killed_trainer_is_retried_from_its_checkpoint_into_one_history(
    ray_cluster: LocalRayCluster,
    ray: RayJobs,
    db_url: str,
    tmp_path: Path,
    page: Any,
) -> None:
    settings = make_settings(
        db_url,
        ray_cluster.address,
        follow_interval_s=0.3,
        tiny_grpo_checkpoint_root=str(tmp_path / "checkpoints"),
    )
    with ServerThread(create_app(settings)) as url, httpx.Client(base_url=url) as http:
        run_id = http.post("/runs", json=SPEC).json()["id"]
        wait_for(
            lambda: http.get(f"/runs/{run_id}").json()["progress"]["step"] or 0,
            lambda step: step >= 6,
            timeout=180,
            every=0.3,
        )
        # Those who wait for the end: `rlrun status --follow` and the client's wait.
        follow = subprocess.Popen(
            [sys.executable, "-m", "service.cli", "status", run_id, "--follow", "-o", "json"],
            env=os.environ | {"RLRUN_URL": url},
            stdout=subprocess.PIPE,
            text=True,
        )
        waited: list[RunOut] = []
        with Client(url) as client:
            waiter = threading.Thread(target=lambda: waited.append(client.wait(run_id, 300, 0.2)))
            waiter.start()
            pid = int(_TRAINER_PID.findall(http.get(f"/runs/{run_id}/logs").text)[-1])
            os.kill(pid, signal.SIGKILL)
            killed = time.monotonic()
            polled: list[tuple[int, str, str]] = []  # attempt, status, the last attempt's

            def seen(run: dict[str, Any]) -> dict[str, Any]:
                polled.append((run["attempt"], run["status"], run["attempts"][-1]["status"]))
                return run

            running = wait_for(
                lambda: seen(http.get(f"/runs/{run_id}").json()),
                lambda r: r["attempt"] == 2 and r["status"] == "RUNNING",
                timeout=120,
                every=0.1,
            )
            to_running = time.monotonic() - killed
            # The contract: no terminal status between the kill and the next attempt; while
            # the retry was decided the run read RETRYING beside the attempt's FAILED.
            assert not [p for p in polled if p[1] in TERMINAL], polled
            assert (1, "RETRYING", "FAILED") in polled, polled
            waiter.join(300)
            assert [r.status for r in waited] == ["SUCCEEDED"], waited
        out, _ = follow.communicate(timeout=120)
        assert follow.returncode == 0, out
        moves = [
            e["data"]["to_status"]
            for e in map(json.loads, out.splitlines())
            if e["event"] == "status" and e["data"]["from_status"] != e["data"]["to_status"]
        ]
        assert moves[-1] == "SUCCEEDED" and not set(moves[:-1]) & TERMINAL, moves
        assert "RETRYING" in moves, moves
        print(f"\nkill -> attempt 2 RUNNING: {to_running:.1f}s")
        assert running["ray"]["submission_id"] == f"{run_id}-a2"
        done = wait_status(http, run_id, {"SUCCEEDED", "FAILED"}, timeout=180)
        assert done["status"] == "SUCCEEDED", done["events"]
        first, second = done["attempts"]
        assert (first["ray_job_id"], first["status"]) == (run_id, "FAILED")
        assert first["failure"]["class"] == "actor_died", first["failure"]
        assert second["ray_job_id"] == f"{run_id}-a2"
        # Resumed from the newest checkpoint (every 2 versions) before the kill: at most one
        # interval of steps lost.
        resumed = second["resumed_from_step"]
        assert resumed >= 4 and resumed % 2 == 0, second
        assert any(
            f"resumed from global_step_{resumed}" in line
            for line in [ray.logs(f"{run_id}-a2") or ""]
        )
        assert _steps(http, run_id) == list(range(1, VERSIONS + 1))  # one series, no step twice
        reasons = [(e["attempt"], e["reason"]) for e in done["events"]]
        assert (2, "retrying: attempt 2 of 2 after actor_died") in reasons
        assert to_running <= 60, to_running
        _shoot_the_resumed_run(page, url, run_id, resumed)

        # By hand, from the checkpoint: the newest is the last version, nothing left to train.
        resp = http.post(f"/runs/{run_id}/retry", json={"from": "checkpoint"})
        assert resp.status_code == 200, resp.text
        third = _ended_attempt(http, run_id, 3)
        assert third["status"] == "SUCCEEDED"
        assert third["attempts"][-1]["resumed_from_step"] == VERSIONS
        # From scratch: the earlier checkpoints are set aside and every step is logged again.
        http.post(f"/runs/{run_id}/retry", json={"from": "scratch"})
        fourth = _ended_attempt(http, run_id, 4)
        assert fourth["status"] == "SUCCEEDED"
        assert fourth["attempts"][-1]["resumed_from_step"] == 0
        assert _steps(http, run_id) == list(range(1, VERSIONS + 1))
        assert [a["n"] for a in fourth["attempts"]] == [1, 2, 3, 4]
    assert (tmp_path / "checkpoints" / run_id / "superseded-1").is_dir()
