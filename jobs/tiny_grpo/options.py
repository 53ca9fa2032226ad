"""The job's command line, written once: the service builds argv from it, the driver parses it."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, fields

MODULE = "jobs.tiny_grpo"


@dataclass(frozen=True)
class Options:
    prompts: int = 16
    batch_prompts: int = 8
    n: int = 8
    total_rollout_steps: int = 480
    trigger_parameter_sync_step: int = 2
    staleness_threshold: float = 0.5
    lr: float = 2.0
    is_threshold: float = 2.0
    rs_threshold: str = "0.5_2.0"
    val_every: int = 5
    gen_seconds: float = 0.2
    train_seconds: float = 0.05
    trainer_npus: int = 1
    rollout_npus: int = 1
    actor_cpus: float = 0.25
    seed: int = 0


HELP = {
    "prompts": "distinct prompts in the dataset",
    "batch_prompts": "prompts per trainer step",
    "n": "responses per prompt (the GRPO group)",
    "total_rollout_steps": "prompts to train on",
    "rs_threshold": "seq_mean_k1 rejection bounds, lower_upper",
    "val_every": "validate every N parameter versions",
    "gen_seconds": "simulated generation time",
    "train_seconds": "simulated update time",
}
_TYPES = {"int": int, "float": float, "str": str}


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def to_argv(options: Options) -> list[str]:
    """``python3 -m jobs.tiny_grpo --prompts 16 ...``: every option, spelled out."""
    argv = ["python3", "-m", MODULE]
    for f in fields(options):
        argv += [_flag(f.name), str(getattr(options, f.name))]
    return argv


def parse(argv: list[str] | None = None, description: str | None = None) -> Options:
    p = argparse.ArgumentParser(prog=f"python3 -m {MODULE}", description=description)
    for f in fields(Options):
        p.add_argument(
            _flag(f.name), type=_TYPES[str(f.type)], default=f.default, help=HELP.get(f.name)
        )
    return Options(**vars(p.parse_args(argv)))
