"""``python3 -m jobs.verl_launch.saves <checkpoint dir> <verl's pid>``: says each complete verl
checkpoint in the job log (``jobs.checkpoints``) while verl runs.

The launcher starts it just before it hands over to verl (the same process: the pid it names
is verl's). A checkpoint is complete when verl's tracker ``latest_checkpointed_iteration.txt``
names a step whose ``global_step_<N>`` directory is written to the end (``resume.complete``:
the rollouter's ``data.pt``, written last, and every rank's model shard); with ``async_save``
verl writes no tracker (verl #7952), so the newest complete directory counts too. The
checkpoint the run resumed from is there at the start and is not news. It exits once verl
has (after a last look), and never fails the job: a watcher that cannot read says nothing.
Before it exits it ships the rollout samples the workers' shippers left (``jobs.samples``:
the last step's, when verl ended before they looked again).
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from pathlib import Path

from jobs import checkpoints, samples
from jobs.verl_launch import resume

# Well inside a verl step (0.6 s on CPU on a quiet host): a save is said before the next step's
# lines, so what a stop decided on it loses is counted from it, not from a step past it.
POLL_S = 0.25


def saved(root: Path) -> tuple[int, Path] | None:
    """The newest complete checkpoint under ``root``: the tracker's, or a newer complete
    directory (None: none)."""
    try:
        named = resume.tracker_step(root)
        found = resume.newest_complete(root)
        tracked = named is not None and resume.complete(root / f"global_step_{named}")
        if named is not None and tracked and (found is None or found[0] <= named):
            return named, root / f"global_step_{named}"
        return found
    except OSError:
        return None


def news(root: Path, last: int | None, now: tuple[int, Path]) -> list[tuple[int, Path]]:
    """The saves since ``last`` up to ``now``, in order: verl may save twice between two
    looks (short steps, ``save_freq=1``), and each complete one is a checkpoint of the run."""
    try:
        between = [(s, p) for s, p in resume.completes(root) if (last is None or s > last)]
    except OSError:
        between = []
    return [(s, p) for s, p in between if s < now[0]] + [now]


def alive(pid: int) -> bool:
    if os.getppid() != pid:
        return False  # verl has exited: this watcher was handed to another parent
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    return True


def watch(root: Path, pid: int, poll_s: float = POLL_S) -> None:
    first = saved(root)
    last = first[0] if first else None
    while True:
        running = alive(pid)
        now = saved(root)
        if now is not None and (last is None or now[0] > last):
            for step, path in news(root, last, now):
                checkpoints.announce(step, str(path))
            last = now[0]
        if not running:
            return
        time.sleep(poll_s)


def start(root: Path) -> None:
    """Start the watcher of ``root`` for this process (about to become verl)."""
    import subprocess

    subprocess.Popen(
        [sys.executable, "-m", "jobs.verl_launch.saves", str(root), str(os.getpid())],
        stdin=subprocess.DEVNULL,
    )


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        watch(Path(sys.argv[1]), int(sys.argv[2]))
        with contextlib.suppress(Exception):
            samples.ship_left(os.environ)
