"""tiny-grpo writes its samples as verl writes ``trainer.rollout_data_dir`` (a ``<step>.jsonl``
per trainer step: ``input``, ``output``, ``gts``, ``score``, ``step`` and the reward's ``acc``),
with prompts and responses a reader can read, and on the session's real Ray head they reach
``GET /runs/{id}/samples``: every step, its last included, each step's mean score the
``critic/score/mean`` the run logged at it."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient

from jobs import samples as job_samples
from jobs.tiny_grpo.policy import Batch
from jobs.tiny_grpo.rollouts import write_step
from service.recipes.tiny_grpo import default_checkpoint_root
from tests.conftest import TERMINAL, TEST_INSTANCE, wait_for, wait_status

SCORE_MEAN = "critic/score/mean"
# Four trainer steps of 8 prompts x 8 responses; a sync each step, so its version is its step.
SPEC = {"recipe": "tiny-grpo", "total_rollout_steps": 32, "trigger_parameter_sync_step": 1,
        "gen_seconds": 0.05, "train_seconds": 0.0, "val_every": 100}  # fmt: skip
RESPONSE = re.compile(r"The answer is (\\boxed\{\d\}|\d)\.")


def test_a_step_file_is_verls_format_with_readable_text(tmp_path: Path) -> None:
    prompts = np.array([[3, 5], [9, 4]], dtype=np.int64)
    expected = np.array([8, 3], dtype=np.int64)
    batch = Batch(0, np.array([0, 0, 1, 1]), np.array([1, 0, 1, 1]), np.array([8, 8, 2, 3]),
                  np.array([1.0, 0.0, 0.1, 1.0]), np.zeros((4, 2)), 2)  # fmt: skip
    path = write_step(str(tmp_path), 7, batch, prompts, expected)
    assert path.name == "7.jsonl" and [p.name for p in tmp_path.iterdir()] == ["7.jsonl"]
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert rows[0] == {"input": "What is (3 + 5) mod 10? Put the final answer in \\boxed{}.",
                       "output": "The answer is \\boxed{8}.", "gts": "8", "score": 1.0,
                       "step": 7, "acc": True}  # fmt: skip
    assert [r["output"] for r in rows[1:]] == [
        "The answer is 8.",
        "The answer is \\boxed{2}.",
        "The answer is \\boxed{3}.",
    ]
    assert [r["acc"] for r in rows] == [True, False, False, True]
    # The shipper reads it as it reads verl's.
    assert all(
        isinstance(job_samples.read_sample(line), dict)
        for line in path.read_bytes().split(b"\n")
        if line
    )


@pytest.mark.timeout(300)
def test_a_runs_samples_reach_the_service_every_step_with_its_logged_mean(
    sqlite_service: Callable[..., TestClient],
) -> None:
    with sqlite_service(follow_interval_s=0.3) as client:
        resp = client.post("/runs", json=SPEC)
        assert resp.status_code == 201, resp.text
        run_id = resp.json()["id"]
        run = wait_status(client, run_id, TERMINAL, timeout=180)
        assert run["status"] == "SUCCEEDED", run
        got = wait_for(
            lambda: client.get(
                f"/runs/{run_id}/samples", params={"steps": "true", "limit": 500}
            ).json(),
            lambda page: len(page["steps"] or []) == 4,
            timeout=30,
        )
        series = client.get(f"/runs/{run_id}/metrics", params={"keys": SCORE_MEAN}).json()
    files = Path(default_checkpoint_root(TEST_INSTANCE)) / run_id / job_samples.SUBDIR
    assert sorted(int(p.stem) for p in files.glob("*.jsonl")) == [1, 2, 3, 4]
    assert got["skipped"] == 0 and got["kept"] == 4 * 64
    logged = {p["step"]: p["value"] for p in series["series"][SCORE_MEAN]}
    for step in got["steps"]:
        assert step["count"] == step["of"] == 64
        assert step["mean"] == pytest.approx(logged[step["step"]], abs=1e-9), (step, logged)
    for item in got["items"]:
        assert item["input"].startswith("What is (") and RESPONSE.fullmatch(item["output"])
        assert item["extras"]["acc"] is (item["score"] == 1.0)
