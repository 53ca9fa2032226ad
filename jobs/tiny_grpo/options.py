"""The job's command line, written once: the driver parses it, the service takes its defaults
from it and builds argv with it."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any

MODULE = "jobs.tiny_grpo"


def parser(description: str | None = None) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=f"python3 -m {MODULE}", description=description)
    p.add_argument("--total-rollout-steps", type=int, default=480, help="prompts to train on")
    p.add_argument("--prompts", type=int, default=16, help="distinct prompts in the dataset")
    p.add_argument("--n", type=int, default=8, help="responses per prompt (the GRPO group)")
    p.add_argument("--batch-prompts", type=int, default=8, help="prompts per trainer step")
    p.add_argument("--rs-threshold", default="0.5_2.0", help="seq_mean_k1 bounds lower_upper")
    p.add_argument("--trigger-parameter-sync-step", type=int, default=2)
    p.add_argument("--lr", type=float, default=2.0, help="learning rate of the logit table")
    p.add_argument("--staleness-threshold", type=float, default=0.5)
    p.add_argument("--is-threshold", type=float, default=2.0)
    p.add_argument("--val-every", type=int, default=5, help="validate every N versions")
    p.add_argument("--train-seconds", type=float, default=0.05, help="simulated update time")
    p.add_argument("--gen-seconds", type=float, default=0.2, help="simulated generation time")
    p.add_argument("--actor-cpus", type=float, default=0.25)
    p.add_argument("--rollout-npus", type=int, default=1)
    p.add_argument("--trainer-npus", type=int, default=1)
    p.add_argument("--seed", type=int, default=0, help="seeds the task and the policy")
    p.add_argument("--checkpoint-dir", default="", help="where checkpoints go (none if empty)")
    p.add_argument("--save-every", type=int, default=0, help="save every N versions (0: never)")
    p.add_argument(
        "--rollout-data-dir", default="", help="each trainer step's samples as <step>.jsonl"
    )
    p.add_argument(
        "--resume", choices=["auto", "disable"], default="auto", help="from the newest checkpoint"
    )
    return p


# Each option's default by its name (``batch_prompts`` for ``--batch-prompts``), in order.
DEFAULTS: dict[str, Any] = vars(parser().parse_args([]))


def to_argv(values: Mapping[str, object]) -> list[str]:
    """``python3 -m jobs.tiny_grpo --prompts 16 ...`` for ``values`` (option name -> value)."""
    unknown = set(values) - set(DEFAULTS)
    if unknown:
        raise ValueError(f"not options of {MODULE}: {sorted(unknown)}")
    argv = ["python3", "-m", MODULE]
    for name in DEFAULTS:
        if name in values:
            argv += ["--" + name.replace("_", "-"), str(values[name])]
    return argv
