"""Processes of an embedded cluster's job user that belong to no live job: found and ended.

Every process of a live node is in its ``ray start``'s tree (the raylet, its workers, each job's
supervisor and driver, what they start). A process a job detaches (``setsid`` and a double
fork) leaves that tree: its parent is init once the middle process exits. So a process of the
job user whose topmost ancestor of that user is no live node of this handle's (``roots``) is
in no node; it belongs to the job its environment names (Ray's job config, inherited, holds its
submission id) while that job lives, and to none otherwise: then it is a stray, ended. A
process whose top was started by another live process of another user than init (a node of
another service given the same user by its operator) is that one's, never touched.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

# Ray's job config in a driver's environment (``RAY_JOB_CONFIG_JSON_ENV_VAR``): its metadata
# holds the submission id under ``job_submission_id``.
_JOB_CONFIG = b"RAY_JOB_CONFIG_JSON_ENV_VAR="
COMMAND_CHARS = 160


@dataclass(frozen=True)
class Stray:
    pid: int
    started: str  # its start time (clock ticks since boot): a pid reused is another process
    job: str | None  # the submission id its environment names, if any
    command: str  # cut to COMMAND_CHARS, control characters removed

    def said(self, user: str) -> str:
        whose = f"of job {self.job}" if self.job else "of no job it names"
        return f"process {self.pid} {whose} as {user}, in no live job: {self.command}"


@dataclass(frozen=True)
class _Proc:
    pid: int
    ppid: int
    uid: int
    started: str


def _procs(uid: int) -> dict[int, _Proc]:
    """The live processes of ``uid`` (a directory's owner under /proc is its process's user: a
    stat, no read, for the others) and, for each, whether its parent is one."""
    owners: dict[int, int] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                owners[int(entry.name)] = entry.stat(follow_symlinks=False).st_uid
    out: dict[int, _Proc] = {}
    for pid, owner in owners.items():
        if owner != uid:
            continue
        try:
            text = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        fields = text[text.rindex(")") + 2 :].split()
        if fields[0] in ("Z", "X"):
            continue
        out[pid] = _Proc(pid, int(fields[1]), owner, fields[19])
    for pid, owner in owners.items():  # the others, as parents: their user only
        out.setdefault(pid, _Proc(pid, 0, owner, ""))
    return out


def find(uid: int, roots: Collection[int], live: Collection[str]) -> list[Stray]:
    """The processes of ``uid`` in no tree of ``roots`` (this handle's live nodes) and of no
    job in ``live`` (submission ids), nor started by another live user's process (not init)."""
    procs = _procs(uid)
    me = os.getpid()
    found = []
    for proc in procs.values():
        if proc.uid != uid:
            continue
        top = proc
        while (parent := procs.get(top.ppid)) is not None and parent.uid == uid:
            top = parent
        if top.pid in roots:
            continue
        parent = procs.get(top.ppid)
        if parent is not None and parent.pid not in (1, me):
            continue  # another user's live process started it (another service's node)
        job = _job(proc.pid)
        if job is not None and job in live:
            continue
        found.append(Stray(proc.pid, proc.started, job, _command(proc.pid)))
    return found


def end(strays: Collection[Stray]) -> list[Stray]:
    """SIGKILL each of ``strays`` (and its process group when it leads one); those ended."""
    ended = []
    for stray in strays:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if os.getpgid(stray.pid) == stray.pid:
                os.killpg(stray.pid, signal.SIGKILL)
            else:
                os.kill(stray.pid, signal.SIGKILL)
            ended.append(stray)
    return ended


def _job(pid: int) -> str | None:
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return None
    for item in environ.split(b"\0"):
        if item.startswith(_JOB_CONFIG):
            with contextlib.suppress(ValueError, AttributeError, TypeError):
                job = json.loads(item[len(_JOB_CONFIG) :])["metadata"]["job_submission_id"]
                return str(job) if job else None
    return None


def _command(pid: int) -> str:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return "?"
    text = raw.replace(b"\0", b" ").decode(errors="replace").strip()
    return "".join(c for c in text if c.isprintable())[:COMMAND_CHARS]
