"""Driver: place the rollout and trainer groups, then run fully async GRPO to the end.

The rollouter always has up to ``1 + ceil(staleness_threshold x trigger_parameter_sync_step)``
generation calls queued, so it keeps generating with the weights it has while the trainer
trains (responses are at most that many batches stale); every ``trigger_parameter_sync_step``
trainer steps the weights are synced and the parameter version goes up by one.
"""

from __future__ import annotations

import math
import sys
import time
from collections import deque
from typing import Any

import ray

from jobs import grant
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
        )
    )
    steps = args.total_rollout_steps // args.batch_prompts
    trigger = args.trigger_parameter_sync_step
    depth = 1 + math.ceil(args.staleness_threshold * trigger)
    print(f"[TinyGrpo] {steps} trainer steps, sync every {trigger}, {depth} batches in flight")
    inflight = deque(rollouter.generate.remote() for _ in range(depth))
    version = 0
    for step in range(1, steps + 1):
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
    # Let Ray forward the actors' last lines to this driver's log before it exits.
    time.sleep(1.5)
    print("[TinyGrpo] training finished", flush=True)


if __name__ == "__main__":
    main()
