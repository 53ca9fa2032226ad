"""What a job says when one of its checkpoints is complete: one line in its log,
``rlrun checkpoint: {"step": N, "path": "..."}``, printed once the save is whole (tiny-grpo
after its atomic rename; for verl, the launcher's watcher once verl's tracker names a
``global_step_<N>`` written to the end). The service learns of saves from this line alone (it
reads the job log through Ray; nothing in a job reaches the service), so the trainer's disk
need not be the service's."""

from __future__ import annotations

import json

PREFIX = "rlrun checkpoint: "


def announce(step: int, path: str | None) -> None:
    print(PREFIX + json.dumps({"step": step, "path": path}), flush=True)
