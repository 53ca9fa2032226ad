"""Stops at the next checkpoint on the real local Ray head, with tiny-grpo runs side by side
(one service, then another on the same database): a cancel that waits for the next save, one
whose wait runs out, a deadline, a target, and a service restart while a stop waits; then a
retry resumes the stopped run from the checkpoint it stopped at."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from service.cluster.ray_jobs import RayJobs
from tests.conftest import wait_for, wait_status

pytestmark = [pytest.mark.ray, pytest.mark.slow]

# About 0.4 s a parameter version (two trainer steps of 0.2 s generations); far more versions
# than any run here lives for.
LONG = {"recipe": "tiny-grpo", "total_rollout_steps": 16 * 400, "gen_seconds": 0.2}
AT_CHECKPOINT = {"at": "next_checkpoint", "within_s": 300}


def _kinds(run: dict[str, Any]) -> list[tuple[str, int | None]]:
    return [(e["kind"], e["step"]) for e in run["events"] if e["kind"]]


def _checkpointed(client: TestClient, run_id: str) -> dict[str, Any]:
    run: dict[str, Any] = wait_for(
        lambda: client.get(f"/runs/{run_id}").json(),
        lambda r: (
            r["checkpoint"] is not None or r["status"] not in ("QUEUED", "SUBMITTED", "RUNNING")
        ),
        timeout=120,
        every=0.3,
    )
    assert run["checkpoint"] is not None, run
    return run


def _ended_by(run: dict[str, Any]) -> str:
    """The reason of the run's last change of status (a note may follow it)."""
    reason: str = [e for e in run["events"] if e["from_status"] != e["to_status"]][-1]["reason"]
    return reason


def _settled(client: TestClient, run_id: str) -> dict[str, Any]:
    """The ended run once its log is read to the end (its failure, here why it stopped, set)."""
    run: dict[str, Any] = wait_for(
        lambda: client.get(f"/runs/{run_id}").json(),
        lambda r: r["failure"] is not None,
        timeout=30,
    )
    return run


def _submit(client: TestClient, **spec: Any) -> str:
    resp = client.post("/runs", json=LONG | spec)
    assert resp.status_code == 201, resp.text
    run_id: str = resp.json()["id"]
    return run_id


def test_runs_stop_at_their_next_checkpoint_their_deadline_and_target_across_a_restart(
    sqlite_service: Callable[..., TestClient], ray: RayJobs, tmp_path: Path
) -> None:
    service = lambda: sqlite_service(  # noqa: E731 - the same service, twice
        tiny_grpo_checkpoint_root=str(tmp_path / "ckpt"), deadline_margin_s=35
    )
    with service() as client:
        cancelled = _submit(client, name="cancelled", save_every=6)
        restarted = _submit(client, name="restarted", save_every=6)
        grace = _submit(client, name="grace")  # saves no checkpoint
        deadline = _submit(client, name="deadline", save_every=4, max_duration_s=40)
        target = _submit(
            client,
            name="target",
            save_every=4,
            stop_when={"key": "training/global_step", "op": ">=", "value": 6},
        )
        first = _checkpointed(client, cancelled)["checkpoint"]["step"]
        asked = client.post(f"/runs/{cancelled}/cancel", json=AT_CHECKPOINT).json()
        assert asked["status"] == "RUNNING" and asked["stop"]["by"] is not None
        stopped = wait_status(client, cancelled, {"STOPPED", "FAILED"}, timeout=60)
        wait_for(  # a few steps logged, none saved
            lambda: client.get(f"/runs/{grace}").json()["progress"]["step"] or 0,
            lambda step: step >= 2,
            timeout=120,
            every=0.3,
        )
        client.post(f"/runs/{grace}/cancel", json={"at": "next_checkpoint", "within_s": 2})
        waiting = _checkpointed(client, restarted)["checkpoint"]["step"]
        client.post(f"/runs/{restarted}/cancel", json=AT_CHECKPOINT)
    # The service is down while ``restarted`` saves its next checkpoint: the request is stored.
    time.sleep(4)
    with service() as client:
        ended = {
            run_id: wait_status(client, run_id, {"STOPPED", "SUCCEEDED", "FAILED"}, timeout=180)
            for run_id in (cancelled, restarted, grace, deadline, target)
        }
        for run_id, asked_after in ((cancelled, first), (restarted, waiting)):
            run = _settled(client, run_id)
            reasons = [e["reason"] for e in run["events"]]
            decided = f"stop requested: checkpoint at step {asked_after + 6} saved (cancelled by "
            assert any(r.startswith(decided) for r in reasons), reasons
            saves = [s for k, s in _kinds(run) if k == "checkpoint"]
            kinds = _kinds(run)
            at = kinds.index(("stop_requested", None))
            assert kinds[at - 1 : at + 2] == [
                ("checkpoint", asked_after),
                ("stop_requested", None),
                ("checkpoint", asked_after + 6),
            ], reasons
            # Stopped right after that save; had the job saved again before Ray stopped it (a
            # service down, a slow stop), the newest is where a retry resumes, said in a note.
            stop = run["stop"]
            assert run["status"] == "STOPPED" and stop["saved_step"] == saves[-1], (stop, reasons)
            assert f"stopped at checkpoint step {saves[-1]}" in run["failure"]["summary"]
            if saves[-1] == asked_after + 6:
                assert stop["steps_lost"] == 0 and _ended_by(run).endswith(
                    f"stopped at checkpoint step {saves[-1]}, 0 steps lost"
                )
        assert stopped["stop"]["saved_step"] == first + 6 and stopped["stop"]["steps_lost"] == 0
        saved = _settled(client, cancelled)["stop"]["saved_step"]
        run = ended[grace]
        assert run["status"] == "STOPPED" and run["stop"]["saved_step"] is None
        assert run["stop"]["steps_lost"] > 0, run["stop"]
        assert "no checkpoint in time" in " ".join(e["reason"] for e in run["events"])
        assert _ended_by(run).endswith(
            f"stopped with no checkpoint, {run['stop']['steps_lost']} steps lost"
        )
        # Asked 35 s before its deadline (set-up counts), stopped at its next save or at the
        # deadline, whichever came first on this machine.
        run = ended[deadline]
        assert run["status"] == "STOPPED", run["events"]
        assert _ended_by(run).startswith("deadline: 40 s from admission: stopped ")
        lived = datetime.fromisoformat(run["ended_at"]) - datetime.fromisoformat(
            run["submitted_at"]
        )
        assert lived.total_seconds() < 40 + 20, lived
        run = ended[target]
        assert run["status"] == "SUCCEEDED", run["events"]
        assert _ended_by(run) == (
            "target reached at step 3 (training/global_step >= 6 for 1 steps): "
            "stopped at checkpoint step 4, 0 steps lost"
        )
        # Retried by hand, the stopped run resumes from the checkpoint it stopped at.
        assert client.post(f"/runs/{cancelled}/retry").status_code == 200
        again = wait_for(
            lambda: client.get(f"/runs/{cancelled}").json(),
            lambda r: r["attempt"] == 2 and r["attempts"][-1]["resumed_from_step"] is not None,
            timeout=120,
            every=0.5,
        )
        assert again["attempts"][-1]["resumed_from_step"] == saved
        assert again["stop"] is None and again["checkpoint"] is None
        client.post(f"/runs/{cancelled}/cancel")
        wait_status(client, cancelled, {"STOPPED"}, timeout=60)
