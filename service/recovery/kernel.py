"""The kernel's own word on a process it killed for memory: its log (``/dev/kmsg``) read by the
service on its own host, which holds the embedded cluster's nodes. A job can write its own log,
never the kernel's, so this is memory evidence no other team's job can forge.

The kernel words an OOM kill ``Out of memory: Killed process <pid> (<comm>) ...`` (a cgroup's
limit: ``Memory cgroup out of memory: Killed process ...``) and, since 4.19, ``oom-kill:...,
pid=<pid>,uid=<uid>``; both name the pid, which is what is matched."""

from __future__ import annotations

import errno
import os
import re
from collections.abc import Collection
from pathlib import Path

KMSG = Path("/dev/kmsg")
PREFIX = "the kernel: "
MAX_RECORDS = 100_000
# The record's text after its ``priority,sequence,time,flags;`` header.
_KILLED = re.compile(r"Killed process (\d+)\b|\boom-kill:\S*\bpid=(\d+)\b")


def oom_kills(pids: Collection[int], source: Path = KMSG) -> list[str]:
    """The kernel's lines on an OOM kill of any of ``pids`` still in its ring buffer, each as
    ``the kernel: <its text>``; none when its log cannot be read (not root, no such device)."""
    if not pids:
        return []
    try:
        fd = os.open(source, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return []
    found: list[str] = []
    try:
        for _ in range(MAX_RECORDS):
            try:
                record = os.read(fd, 8192)
            except OSError as exc:
                if exc.errno == errno.EPIPE:  # a record overwritten while read: the next
                    continue
                break  # EAGAIN: the end of the buffer
            if not record:
                break
            # One record a read from the device (its continuation lines start with a space);
            # a file of records gives several.
            for line in record.decode(errors="replace").splitlines():
                text = line.split(";", 1)[-1]
                match = None if line.startswith(" ") else _KILLED.search(text)
                if match and int(match[1] or match[2]) in pids:
                    found.append(f"{PREFIX}{text.strip()}"[:1000])
    finally:
        os.close(fd)
    return found
