"""verl's own rollout samples of the session's real run (``tests/verl_run.py``) came home: every
step verl wrote is in ``GET /runs/{id}/samples``, in ``rlrun samples``, with verl's fields, and
the mean score the service holds for a step is that of the samples it kept. (The fully async
trainer's file for a step is not the batch of its logged ``critic/score/mean``: a step's file
held 0.25 where verl logged 0.10 with nothing masked, so the two are not compared.)"""

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
    pytest.mark.timeout(2400),
]

PER_STEP = 64  # the spec's default samples.per_step


def written(verl_run: VerlRun) -> dict[int, list[dict[str, Any]]]:
    """What verl wrote, file by file (``trainer.rollout_data_dir`` in the run's own dir)."""
    files = sorted((verl_run.checkpoints / "rollout-samples").glob("*.jsonl"))
    assert files, "verl wrote no rollout samples"
    return {int(f.stem): [json.loads(x) for x in f.read_text().splitlines()] for f in files}


def test_every_step_verl_wrote_is_served_with_its_fields_and_the_mean_of_those_kept(
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
    # A frame line the log did not carry whole is counted as skipped, never stored: rare (a
    # step's frames are one write), and its step is then short of the samples it shipped.
    assert got["skipped"] <= max(1, len(files) // 20), got["skipped"]
    assert {"input", "output", "gts", "score", "step"} <= set(files[min(files)][0])
    item = got["items"][0]
    assert item["input"] and item["output"] and isinstance(item["score"], float)
    short = 0
    for step, rows in files.items():
        held = steps[step]
        assert held["of"] == len(rows)
        if held["count"] == min(PER_STEP, len(rows)):  # a step's first ones, as shipped
            kept = rows[: held["count"]]
            assert held["mean"] == pytest.approx(sum(r["score"] for r in kept) / len(kept))
        else:
            short += 1
    assert short <= got["skipped"], (short, got["skipped"])


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
