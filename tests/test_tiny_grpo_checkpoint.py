"""tiny-grpo's checkpoints, laid out as verl's, and its resume from the newest complete one."""

from __future__ import annotations

import re
import shlex
import uuid
from pathlib import Path

import numpy as np

from jobs.tiny_grpo import checkpoint
from jobs.tiny_grpo.options import to_argv
from jobs.tiny_grpo.policy import Weights
from service.cluster.ray_jobs import RayJobs
from service.loops.submitter import JOBS_DIR
from tests.conftest import wait_for


def test_the_newest_complete_checkpoint_is_found_without_the_tracker(tmp_path: Path) -> None:
    weights = Weights.zeros(3)
    checkpoint.save(tmp_path, 2, weights, global_step=4, cursor=32)
    weights.answer[1, 2] = 7.0
    checkpoint.save(tmp_path, 5, weights, global_step=10, cursor=80)
    (tmp_path / checkpoint.TRACKER).unlink()  # never written (or lost): the steps still say
    (tmp_path / ".saving-x").mkdir()  # a save that died half way is not a checkpoint
    (tmp_path / "global_step_9").mkdir()  # nor is a directory without its state
    found = checkpoint.newest(tmp_path)
    assert found == tmp_path / "global_step_5"
    restored, version, step, cursor = checkpoint.load(found)
    assert (version, step, cursor) == (5, 10, 80)
    assert np.array_equal(restored.answer, weights.answer)
    assert checkpoint.newest(tmp_path / "nothing") is None


def _run(ray: RayJobs, argv: list[str]) -> str:
    """Run tiny-grpo as a Ray job on the session cluster to its end; its log."""
    job = f"ckpt-{uuid.uuid4().hex[:8]}"
    ray.submit(
        job,
        shlex.join(argv),
        {"py_modules": [ray.package_uri(JOBS_DIR)], "env_vars": {"PYTHONUNBUFFERED": "1"}},
        {},
        entrypoint_num_cpus=0.25,
    )
    info = wait_for(
        lambda: ray.get(job),
        lambda i: i is not None and i.status in {"SUCCEEDED", "FAILED", "STOPPED"},
        timeout=180,
    )
    log = ray.logs(job) or ""
    assert info.status == "SUCCEEDED", log[-3000:]
    return log


def _versions(log: str) -> list[int]:
    """Parameter versions of the trainer's training lines."""
    return [int(v) for v in re.findall(r"step:(\d+) - training/global_step", log)]


def test_a_second_run_resumes_from_the_first_run_s_newest_checkpoint(
    ray: RayJobs, tmp_path: Path
) -> None:
    options = {
        "batch_prompts": 4,
        "trigger_parameter_sync_step": 2,
        "gen_seconds": 0.01,
        "train_seconds": 0.0,
        "checkpoint_dir": str(tmp_path),
        "save_every": 1,
    }
    first = _run(ray, to_argv(options | {"total_rollout_steps": 24}))  # 6 steps: versions 1-3
    assert _versions(first) == [1, 2, 3]
    assert "no checkpoint to resume from" in first
    second = _run(ray, to_argv(options | {"total_rollout_steps": 40}))  # 10 steps: to version 5
    assert "resumed from global_step_3 (trainer step 6)" in second
    # One history: the second run trains only what the first had not.
    assert _versions(second) == [4, 5]
    assert re.search(r"step:5 - training/global_step:10\b", second)
