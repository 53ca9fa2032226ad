"""verl's V1 trainer (``trainer_mode: separate_async``), for real, under the service: preset
``cpu-smoke-v1`` of ``verl-fully-async`` from POST /runs to SUCCEEDED on a service and embedded
Ray head of its own (CPU only). Its metrics arrive under V1's own names, its progress is the
trainer step it syncs the weights at, its end is judged against the planned steps, verl writes
a checkpoint a step in its own layout, and the samples it writes come home.

Its weight sync is broken on purpose (the ``file-stale`` checkpoint engine, a fault drill: every
sync sends the first sync's weights while the trainer's digest names the weights it should have
sent): the run trains and ends as before, but its health reads ``weights_unsynced`` from the
first sync the rollout did not take, naming the version and both digests.

Its own run (the session's shared run is the fully async trainer's, ``tests/verl_run.py``): one
more verl start-up. It asks for the session's verl lock (``verl_lock``: taken at collection,
before its timeout starts). Slow, and it needs the trainer stack (rlrun[verl-cpu], README):
without it the test fails, never skips.
"""

from __future__ import annotations

import json
import time

import httpx
import pytest

from jobs.verl_launch import resume
from service.metrics.keys import STEP_KEY, TRAINER_STEP_KEY
from service.recipes.verl.preset import SMOKE_V1_STEPS, cpu_smoke_v1
from service.settings import Settings
from tests.test_verl_v1_log import V1_KEYS
from tests.verl_run import own_service, wait_end

pytestmark = [pytest.mark.slow, pytest.mark.ray, pytest.mark.timeout(1500, func_only=True)]

STALE = "actor_rollout_ref.rollout.checkpoint_engine.backend=file-stale"
OVERRIDES = [
    STALE if o.startswith("actor_rollout_ref.rollout.checkpoint_engine.backend=") else o
    for o in cpu_smoke_v1(Settings())["overrides"]
]
REQUEST = {
    "recipe": "verl-fully-async",
    "preset": "cpu-smoke-v1",
    "name": "cpu-smoke-v1",
    "overrides": OVERRIDES,
}
# The head's and dashboard's ports (offsets from RAY_PORT): beside the other verl runs', and none
# a Ray-lane test uses.
PORTS = (1900, 2000)


def test_the_v1_trainer_trains_for_real_under_the_service(verl_lock: None) -> None:
    started = time.monotonic()
    with (
        own_service("rlrun-verl-v1-", PORTS) as (root, service),
        httpx.Client(base_url=service.url, timeout=30) as http,
    ):
        resp = http.post("/runs", json=REQUEST)
        assert resp.status_code == 201, resp.text
        run_id = resp.json()["id"]
        run = wait_end(http, run_id)
        print(f"\nthe V1 run {run_id}: {run['status']} in {time.monotonic() - started:.0f} s")
        if run["status"] != "SUCCEEDED":
            print(json.dumps({k: run.get(k) for k in ("events", "failure")})[:20_000])
            print(http.get(f"/runs/{run_id}/logs", params={"tail": 300}).text[-30_000:])
        assert run["status"] == "SUCCEEDED"
        statuses = [e["to_status"] for e in run["events"]]
        assert statuses[0] == "QUEUED" and "RUNNING" in statuses, statuses

        # Progress and the truthful end: V1's trainer step, one weight sync each.
        progress = run["progress"]
        got_progress = (progress["step"], progress["total_steps"], progress["key"])
        assert got_progress == (SMOKE_V1_STEPS, SMOKE_V1_STEPS, TRAINER_STEP_KEY), progress
        keys = set(http.get(f"/runs/{run_id}/metrics/keys").json())
        assert keys >= V1_KEYS, V1_KEYS - keys
        assert STEP_KEY not in keys and not [k for k in keys if k.startswith("fully_async/")]
        series = http.get(
            f"/runs/{run_id}/metrics", params={"keys": TRAINER_STEP_KEY, "max_points": 100}
        ).json()["series"][TRAINER_STEP_KEY]
        assert [p["step"] for p in series] == list(range(1, SMOKE_V1_STEPS + 1)), series

        # verl's own checkpoint layout, a complete save a step.
        tree = root / "checkpoints" / run_id
        assert resume.tracker_step(tree) == SMOKE_V1_STEPS
        for step in range(1, SMOKE_V1_STEPS + 1):
            assert resume.complete(tree / f"global_step_{step}"), step

        # The sync broken on purpose is seen: the rollout's weights stayed the first sync's.
        assert STALE in run["command"], run["command"]
        health, sync = run["health"], run["weight_sync"]
        assert health["status"] == "weights_unsynced", (health, sync)
        assert "never reached the rollout" in health["reason"], health
        assert "its newest load was version" in health["reason"], health
        noted = [e["reason"] for e in run["events"] if e["reason"].startswith("weight sync not")]
        assert len(noted) == 1 and sync["problem"] == health["reason"], (noted, sync)
        print("broken sync:", health["reason"])

        # The samples V1 wrote (its own writer) are served, step by step.
        files = sorted((tree / "rollout-samples").glob("*.jsonl"))
        assert files, "verl's V1 trainer wrote no rollout samples"
        got = http.get(f"/runs/{run_id}/samples", params={"steps": "true"}).json()
        assert {s["step"] for s in got["steps"]} == {int(f.stem) for f in files}, got["steps"]
        for held in got["steps"]:
            written = (tree / "rollout-samples" / f"{held['step']}.jsonl").read_text()
            assert held["of"] == len(written.splitlines()), held
