"""tiny-grpo on the real local Ray head: metrics through the log follower to /events, /metrics
and /runs/{id}, across a service restart, for two SSE clients that resume with Last-Event-ID."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from service.app import create_app
from service.cli import app as cli
from service.cluster.local_ray import LocalRayCluster
from service.cluster.ray_jobs import RayJobs
from service.metrics.parse import parse_line
from service.wire.documents import encode
from tests.conftest import TERMINAL, make_settings, wait_status
from tests.live import ServerThread, SseClient

pytestmark = pytest.mark.ray

CAPTURE = Path(__file__).parent / "data" / "tiny_grpo_job_log.txt"
SPEC = {"recipe": "tiny-grpo", "name": "tiny", "total_rollout_steps": 320, "gen_seconds": 0.25}


def printed(log: str) -> list[tuple[int, dict[str, Any]]]:
    """What the job printed, line by line, as the stream encodes it."""
    out = []
    for line in log.splitlines():
        parsed = parse_line(line)
        if parsed is not None:
            out.append((parsed.step, json.loads(encode(parsed.values))))
    return out


def test_tiny_grpo_metrics_stream_live_and_match_the_log_across_a_service_restart(
    ray_cluster: LocalRayCluster, ray: RayJobs, db_url: str
) -> None:
    settings = make_settings(db_url, ray_cluster.address, follow_interval_s=0.3, events_poll_s=0.3)
    with ServerThread(create_app(settings)) as url, httpx.Client(base_url=url) as http:
        resp = http.post("/runs", json=SPEC)
        assert resp.status_code == 201, resp.text
        run_id = resp.json()["id"]
        clients = [SseClient(run_id, url).start() for _ in range(2)]
        wait_status(http, run_id, {"RUNNING"}, timeout=90)
        for client in clients:
            client.wait(lambda c: len(c.metrics()) >= 3)
        mid = http.get(f"/runs/{run_id}").json()
        assert mid["status"] == "RUNNING" and mid["progress"]["step"] >= 1
    # The service restarts in the middle of the run; the clients reconnect with Last-Event-ID.
    settings = make_settings(db_url, ray_cluster.address, follow_interval_s=0.3, events_poll_s=0.3)
    with ServerThread(create_app(settings)) as url, httpx.Client(base_url=url) as http:
        for client in clients:
            client.move_to(url)
        run = wait_status(http, run_id, TERMINAL, timeout=120)
        for client in clients:
            assert client.ended.wait(60)
        # The streams end once the whole log is read: the run then shows where it ended.
        run = http.get(f"/runs/{run_id}").json()
        series = http.get(f"/runs/{run_id}/metrics", params={"max_points": 10_000}).json()
        tail = http.get(f"/runs/{run_id}/logs", params={"tail": 3}).text
        followed = CliRunner().invoke(cli, ["status", run_id, "--follow", "--server", url])
    assert run["status"] == "SUCCEEDED", run
    log = ray.logs(run_id) or ""
    if os.environ.get("RLRUN_CAPTURE_TINY_GRPO_LOG"):
        CAPTURE.write_text(log)
    expected = printed(log)
    assert expected, "the job printed no metric lines"

    # Live stream: every line the job printed, once, in order, for both clients.
    assert all(c.connections >= 2 for c in clients)
    assert clients[0].metrics() == expected
    assert [e.id for e in clients[0].events] == [e.id for e in clients[1].events]
    assert clients[0].statuses()[-2:] == ["RUNNING", "SUCCEEDED"]

    # History, step for step (a step's key first printed wins).
    history: dict[str, dict[int, Any]] = {}
    for step, values in expected:
        for key, value in values.items():
            history.setdefault(key, {}).setdefault(step, value)
    got = {k: {p["step"]: p["value"] for p in pts} for k, pts in series["series"].items()}
    assert got == history

    # The reward rose; status shows the end of the plan and the latest values.
    rewards = [v["critic/score/mean"] for _, v in expected if "critic/score/mean" in v]
    assert rewards[0] < 0.2 and max(rewards[-3:]) > 0.8
    assert run["progress"]["step"] == run["progress"]["total_steps"] == 20
    assert run["progress"]["trainer_step"] == 40
    assert run["metrics"]["latest"]["critic/score/mean"] == rewards[-1]
    assert tail.splitlines()[-1] == log.rstrip("\n").splitlines()[-1]
    assert followed.exit_code == 0, followed.output
    assert "SUCCEEDED" in followed.output
    assert "step 20 of 20" in followed.output
    assert f"reward {rewards[-1]:.4g}" in followed.output
