"""What a job says when it starts about the checkpoint it resumes from, and what the service
asks of it: ``RLRUN_RESUME`` is "checkpoint" (the newest complete one, the default) or
"scratch" (set earlier checkpoints aside and start again); ``RLRUN_ATTEMPT`` is the attempt."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

RESUME_ENV = "RLRUN_RESUME"
ATTEMPT_ENV = "RLRUN_ATTEMPT"
# verl's checkpoint layout: ``<dir>/global_step_<N>/`` and the tracker naming the newest.
TRACKER = "latest_checkpointed_iteration.txt"
STEP_DIR = re.compile(r"global_step_(\d+)")
# One line in the job log: ``rlrun resume: {"step": N, "path": "..."}`` (step 0: from scratch).
PREFIX = "rlrun resume: "


def wanted() -> str:
    """ "checkpoint" or "scratch", as the service asked (checkpoint when it did not say)."""
    return "scratch" if os.environ.get(RESUME_ENV) == "scratch" else "checkpoint"


def announce(step: int, path: str | None) -> None:
    print(PREFIX + json.dumps({"step": step, "path": path}), flush=True)


def parse(line: str) -> int | None:
    """The step an announce line names (None: no such line)."""
    at = line.find(PREFIX)
    if at < 0:
        return None
    try:
        step = json.loads(line[at + len(PREFIX) :]).get("step")
    except (ValueError, AttributeError):
        return None
    return step if isinstance(step, int) and step >= 0 else None


def set_aside(root: Path) -> Path | None:
    """Move the run's checkpoints into a new ``superseded-<n>/`` beside them (a run started
    again from scratch must not resume from them later); that directory, if any."""
    if not root.is_dir():
        return None
    found = [p for p in root.iterdir() if STEP_DIR.fullmatch(p.name)]
    if not found:
        return None
    n = 1
    while (root / f"superseded-{n}").exists():
        n += 1
    aside = root / f"superseded-{n}"
    aside.mkdir()
    for path in found:
        os.replace(path, aside / path.name)
    (root / TRACKER).unlink(missing_ok=True)
    return aside
