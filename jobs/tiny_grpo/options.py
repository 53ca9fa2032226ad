"""The job's command line, written once: the service builds argv from it, the driver parses it."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field, fields

MODULE = "jobs.tiny_grpo"


def _help(text: str) -> dict[str, str]:
    return {"help": text}


@dataclass(frozen=True)
class Options:
    prompts: int = field(default=16, metadata=_help("distinct prompts in the dataset"))
    batch_prompts: int = field(default=8, metadata=_help("prompts per trainer step"))
    n: int = field(default=8, metadata=_help("responses per prompt (the GRPO group)"))
    total_rollout_steps: int = field(default=480, metadata=_help("prompts to train on"))
    trigger_parameter_sync_step: int = field(
        default=2, metadata=_help("trainer steps between parameter syncs")
    )
    staleness_threshold: float = field(
        default=0.5, metadata=_help("how many batches stale a response may be, per sync")
    )
    lr: float = field(default=2.0, metadata=_help("learning rate of the logit table"))
    is_threshold: float = field(default=2.0, metadata=_help("sequence IS weight truncation"))
    rs_threshold: str = field(
        default="0.5_2.0", metadata=_help("seq_mean_k1 rejection bounds, lower_upper")
    )
    val_every: int = field(default=5, metadata=_help("validate every N parameter versions"))
    gen_seconds: float = field(default=0.2, metadata=_help("simulated generation time"))
    train_seconds: float = field(default=0.05, metadata=_help("simulated update time"))
    trainer_npus: int = field(default=1, metadata=_help("virtual NPUs the trainer holds"))
    rollout_npus: int = field(default=1, metadata=_help("virtual NPUs the rollout holds"))
    actor_cpus: float = field(default=0.25, metadata=_help("CPUs each actor holds"))
    seed: int = field(default=0, metadata=_help("random seed"))


def help_of(name: str) -> str | None:
    """The help text of option ``name`` (also the service's description of the spec field)."""
    return Options.__dataclass_fields__[name].metadata.get("help")


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
            _flag(f.name), type=_TYPES[str(f.type)], default=f.default, help=f.metadata.get("help")
        )
    return Options(**vars(p.parse_args(argv)))
