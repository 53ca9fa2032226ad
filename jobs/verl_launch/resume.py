"""Where a later attempt of a verl run resumes from, decided on the node (the checkpoint dir is
on the cluster, not where the service runs).

verl's ``trainer.resume_mode=auto`` reads the tracker file ``latest_checkpointed_iteration.txt``
and starts from step 0 when it is missing, which it is whenever checkpoints are saved with
``async_save`` (verl #7952). So the launcher looks at the ``global_step_*`` directories itself:
the newest complete one (the rollouter's ``data.pt`` is written last, after the actor's shards,
and every rank's model shard is there) is where the attempt resumes, with ``resume_mode=auto``
when the tracker names it and ``resume_mode=resume_path`` plus ``resume_from_path`` otherwise.
No complete checkpoint: from scratch, said so. A start from scratch by hand sets the earlier
checkpoints aside (``superseded-<n>/``) so no later attempt resumes from them.
"""

from __future__ import annotations

import re
from pathlib import Path

from jobs import resume
from jobs.verl_launch import Plan

CHECKPOINT_KEY = "trainer.default_local_dir"
TRACKER = resume.TRACKER
RESUME_KEYS = ("trainer.resume_mode", "trainer.resume_from_path")
_STEP_DIR = resume.STEP_DIR
_SHARD = re.compile(r"model_world_size_(\d+)_rank_(\d+)\.pt")


def checkpoint_dir(plan: Plan) -> Path | None:
    for check in plan.get("writable", []):
        if check["key"] == CHECKPOINT_KEY:
            return Path(check["path"])
    return None


def complete(step_dir: Path) -> bool:
    """A fully async checkpoint written to the end: the rollouter's dataloader state (saved
    last) and, for FSDP shards, one model shard per rank."""
    actor = step_dir / "actor"
    if not (step_dir / "data.pt").is_file() or not actor.is_dir():
        return False
    shards = [m for p in actor.iterdir() if (m := _SHARD.fullmatch(p.name))]
    if not shards:
        return any(actor.iterdir())  # another layout (Megatron's dist checkpoint): not empty
    world = int(shards[0].group(1))
    return {int(m.group(2)) for m in shards if int(m.group(1)) == world} == set(range(world))


def completes(root: Path) -> list[tuple[int, Path]]:
    """Every complete checkpoint under ``root``, by step."""
    if not root.is_dir():
        return []
    return sorted(
        (int(m.group(1)), p)
        for p in root.iterdir()
        if (m := _STEP_DIR.fullmatch(p.name)) and p.is_dir() and complete(p)
    )


def newest_complete(root: Path) -> tuple[int, Path] | None:
    found = completes(root)
    return found[-1] if found else None


def tracker_step(root: Path) -> int | None:
    try:
        return int((root / TRACKER).read_text().strip())
    except (OSError, ValueError):
        return None


def decide(root: Path | None, wanted: str) -> tuple[list[str], int, str | None]:
    """(overrides for verl, step resumed from (0: scratch), checkpoint path)."""
    if root is None:
        return [], 0, None
    if wanted == "scratch":
        resume.set_aside(root)
        return ["trainer.resume_mode=disable"], 0, None
    found = newest_complete(root)
    if found is None:
        return ["trainer.resume_mode=disable"], 0, None
    step, path = found
    if tracker_step(root) == step:
        return ["trainer.resume_mode=auto"], step, str(path)
    return ["trainer.resume_mode=resume_path", f"trainer.resume_from_path={path}"], step, str(path)


def with_overrides(command: list[str], overrides: list[str]) -> list[str]:
    """``command`` with any resume override it had replaced by ``overrides``."""
    if not overrides:
        return command

    def key(arg: str) -> str:
        return arg.split("=", 1)[0].lstrip("+~")

    return [a for a in command if key(a) not in RESUME_KEYS] + overrides
