"""Driver: place the rollout and trainer groups, then run fully async GRPO to the end.

The rollouter always has up to ``1 + ceil(staleness_threshold x trigger_parameter_sync_step)``
generation calls queued, so it keeps generating with the weights it has while the trainer
trains (responses are at most that many batches stale); every ``trigger_parameter_sync_step``
trainer steps the weights are synced and the parameter version goes up by one.
"""

from __future__ import annotations

import math
import os
import sys
import time
from collections import deque
from pathlib import Path
from typing import Any

import ray

from jobs import checkpoints as saves
from jobs import grant, resume
from jobs import samples as shipper
from jobs.tiny_grpo import checkpoint
from jobs.tiny_grpo.actors import TinyGrpoRollouter, TinyGrpoTrainer
from jobs.tiny_grpo.options import parser
from jobs.tiny_grpo.policy import Correction


def main(argv: list[str] | None = None) -> None:
    args = parser(__doc__).parse_args(argv)
    lower, upper = (float(x) for x in args.rs_threshold.split("_"))
    try:  # the run's secrets, if its spec names any: here and in every worker of the job
        values, submission_id = grant.redeem()
    except grant.GrantRefused as exc:
        sys.exit(f"rlrun launch failed: {exc}")
    ray.init()
    grant.share(values, submission_id)
    rollouter: Any = (
        ray.remote(TinyGrpoRollouter)
        .options(num_cpus=args.actor_cpus, resources={"NPU": args.rollout_npus}, max_concurrency=2)
        .remote(args.prompts, args.batch_prompts, args.n, args.seed, args.gen_seconds)
    )
    trainer: Any = (
        ray.remote(TinyGrpoTrainer)
        .options(num_cpus=args.actor_cpus, resources={"NPU": args.trainer_npus})
        .remote(
            args.prompts,
            args.seed,
            args.lr,
            Correction(args.is_threshold, lower, upper),
            args.train_seconds,
            args.rollout_data_dir,
        )
    )
    steps = args.total_rollout_steps // args.batch_prompts
    trigger = args.trigger_parameter_sync_step
    depth = 1 + math.ceil(args.staleness_threshold * trigger)
    print(f"[TinyGrpo] {steps} trainer steps, sync every {trigger}, {depth} batches in flight")
    checkpoints = Path(args.checkpoint_dir) if args.checkpoint_dir else None
    version, first = _resume(checkpoints, args.resume, rollouter, trainer)
    inflight = deque(
        rollouter.generate.remote() for _ in range(min(depth, max(0, steps - first + 1)))
    )
    for step in range(first, steps + 1):
        waited = time.monotonic()
        ray.wait([inflight[0]])
        batch = inflight.popleft()
        if step + len(inflight) <= steps:
            inflight.append(rollouter.generate.remote())
        ray.get(trainer.train.remote(batch, time.monotonic() - waited))
        if step % trigger == 0 or step == steps:
            version += 1
            synced = time.monotonic()
            ray.get(rollouter.set_weights.remote(trainer.weights_for_sync.remote(), version))
            sync_s = time.monotonic() - synced
            if version % args.val_every == 0 or step == steps:
                ray.get(trainer.validate.remote(version))
            epoch = ray.get(rollouter.epoch.remote())
            ray.get(trainer.log_sync.remote(version, epoch, sync_s))
            if checkpoints is not None and args.save_every and version % args.save_every == 0:
                weights, global_step = ray.get(trainer.checkpoint_state.remote())
                cursor = step * args.batch_prompts  # the prompts trained on so far
                saved = checkpoint.save(checkpoints, version, weights, global_step, cursor)
                print(f"[TinyGrpo] saved checkpoint {saved.name}", flush=True)
                saves.announce(version, str(saved))  # complete: the service may stop the run
    if args.rollout_data_dir and shipper.settings(os.environ) is not None:
        shipper.wait_shipped(args.rollout_data_dir)  # the last step's samples too
    # Let Ray forward the actors' last lines to this driver's log before it exits.
    time.sleep(1.5)
    print("[TinyGrpo] training finished", flush=True)


def _resume(root: Path | None, mode: str, rollouter: Any, trainer: Any) -> tuple[int, int]:
    """(parameter version, first trainer step) to start from: the newest complete checkpoint
    under ``root`` unless resuming is disabled (or the service asked for a start from scratch,
    which sets the earlier checkpoints aside), else the start. Says which (``jobs.resume``)."""
    if root is not None and resume.wanted() == "scratch":
        mode = "disable"
        aside = resume.set_aside(root)
        if aside is not None:
            print(f"[TinyGrpo] from scratch: earlier checkpoints moved to {aside}", flush=True)
    found = checkpoint.newest(root) if root is not None and mode == "auto" else None
    if found is None:
        if root is not None and mode == "auto":
            print("[TinyGrpo] no checkpoint to resume from: starting from scratch", flush=True)
        resume.announce(0, None)
        return 0, 1
    weights, version, global_step, cursor = checkpoint.load(found)
    ray.get(rollouter.restore.remote(weights, version, cursor))
    ray.get(trainer.restore.remote(weights, version, global_step))
    print(f"[TinyGrpo] resumed from {found.name} (trainer step {global_step})", flush=True)
    resume.announce(version, str(found))
    return version, global_step + 1


if __name__ == "__main__":
    main()
