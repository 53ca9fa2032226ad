"""What a job says when it starts about the checkpoint it resumes from, and what the service
asks of it: ``RLRUN_RESUME`` is "checkpoint" (the newest complete one, the default) or
"scratch" (set earlier checkpoints aside and start again); ``RLRUN_ATTEMPT`` is the attempt."""

from __future__ import annotations

import json
import os

RESUME_ENV = "RLRUN_RESUME"
ATTEMPT_ENV = "RLRUN_ATTEMPT"
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
