"""verl's own rollout samples of the session's real run (``tests/verl_run.py``) came home: every
step verl wrote is in ``GET /runs/{id}/samples``, in ``rlrun samples``, with verl's fields, and
where every sample of a step was kept their mean score is that step's ``critic/score/mean`` as
verl logged it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.verl_run import VerlRun

pytestmark = [
    pytest.mark.slow,
    pytest.mark.ray,
    pytest.mark.timeout(1500),
]

SCORE_MEAN = "critic/score/mean"
PER_STEP = 64  # the spec's default samples.per_step


def written(verl_run: VerlRun) -> dict[int, list[dict[str, Any]]]:
    """What verl wrote, file by file (``trainer.rollout_data_dir`` in the run's own dir)."""
    files = sorted((verl_run.checkpoints / "rollout-samples").glob("*.jsonl"))
    assert files, "verl wrote no rollout samples"
    return {int(f.stem): [json.loads(x) for x in f.read_text().splitlines()] for f in files}


def test_every_step_verl_wrote_is_served_with_its_fields_and_verls_mean_score(
    verl_run: VerlRun,
) -> None:
    files = written(verl_run)
    got = verl_run.http.get(
        f"/runs/{verl_run.run_id}/samples", params={"steps": "true", "limit": 500}
    ).json()
    keep = os.environ.get("RLRUN_KEEP_SAMPLES")
    if keep:  # to look at what verl wrote, by hand
        Path(keep).write_text(json.dumps({"files": files, "answer": got}, indent=1))
    steps = {s["step"]: s for s in got["steps"]}
    assert set(steps) == set(files), (sorted(steps), sorted(files))
    assert got["skipped"] == 0
    assert {"input", "output", "gts", "score", "step"} <= set(files[min(files)][0])
    item = got["items"][0]
    assert item["input"] and item["output"] and isinstance(item["score"], float)
    score = verl_run.http.get(
        f"/runs/{verl_run.run_id}/metrics", params={"keys": SCORE_MEAN, "max_points": 10_000}
    ).json()["series"][SCORE_MEAN]
    logged = {p["step"]: p["value"] for p in score}
    compared = 0
    for step, rows in files.items():
        held = steps[step]
        assert held["of"] == len(rows)
        assert held["mean"] == pytest.approx(sum(r["score"] for r in rows) / len(rows))
        if held["count"] == len(rows) and step in logged:
            assert held["mean"] == pytest.approx(logged[step], abs=1e-6), (step, held, logged)
            compared += 1
    assert compared, (sorted(steps), sorted(logged))


def test_rlrun_samples_lists_the_real_steps(verl_run: VerlRun) -> None:
    files = written(verl_run)
    step = max(files)
    out = subprocess.run(
        [sys.executable, "-m", "service.cli", "samples", verl_run.run_id, "--step", str(step),
         "--server", verl_run.service.url, "-o", "json", "--limit", "500"],
        capture_output=True, text=True, timeout=120, check=True,
    ).stdout  # fmt: skip
    body = json.loads(out)
    assert {s["step"] for s in body["items"]} == {step}
    shipped = [r["score"] for r in files[step]][:PER_STEP]  # the step's first ones
    assert sorted(s["score"] for s in body["items"]) == sorted(shipped)
