"""The session's real verl CPU run (``tests/verl_run.py``): where its step time goes (a verdict
with the figures behind it, each step's parts adding up to verl's own step time) and its
start-up (every phase seen, each >= 0 s, adding up to no more than the time to its first step,
and counted in /metrics' histogram)."""

from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

from service.cli import app as cli
from service.metrics import startup
from tests.verl_run import VerlRun

pytestmark = [pytest.mark.slow, pytest.mark.ray, pytest.mark.timeout(2400)]


def test_the_real_run_gets_a_verdict_with_its_figures(verl_run: VerlRun) -> None:
    answer = verl_run.http.get(f"/runs/{verl_run.run_id}/step-time").json()
    print("step-time:", answer)
    assert answer["trainer"] == "fully_async"
    assert answer["verdict"] in ("rollout-bound", "trainer-bound", "sync-bound", "balanced")
    assert answer["steps"], answer
    for step in answer["steps"]:
        parts = step["wait"] + step["update"] + step["sync"] + step["other"]
        assert step["total"] > 0 and step["other"] >= 0
        assert parts >= step["total"] * (1 - 1e-9)  # the rest is what the parts leave
    figures = answer["figures"]
    assert figures["step_seconds"] > 0
    assert 0 <= figures["wait_share"] <= 1 and 0 <= figures["sync_share"] <= 1
    assert set(answer["sources"]) == {"trainer_idle", "rollout_idle"}
    assert answer["change"] is None  # one accelerator a group: no other split
    out = CliRunner().invoke(
        cli, ["why-slow", verl_run.run_id, "--server", str(verl_run.http.base_url).rstrip("/")]
    )
    assert out.exit_code == 0 and out.stdout.startswith(f"{answer['verdict']}: "), out.output


def test_the_real_runs_startup_phases_are_seen_and_add_up_within_its_first_step(
    verl_run: VerlRun,
) -> None:
    run = verl_run.http.get(f"/runs/{verl_run.run_id}").json()
    phases = run["startup"]
    print("startup:", [(p["phase"], p["seconds"]) for p in phases], run["time_to_first_step"])
    assert [p["phase"] for p in phases] == list(startup.PHASES)
    for p in phases:
        assert p["seen"], p
        assert p["seconds"] >= 0, p
    total = run["time_to_first_step"]
    assert total is not None and total > 0
    assert sum(p["seconds"] for p in phases) <= total
    text = verl_run.http.get("/metrics").text
    counted = re.search(r"^rlrun_time_to_first_step_seconds_count (\S+)$", text, re.M)
    assert counted is not None and float(counted[1]) >= 1
