"""The Unix user the embedded cluster's nodes, and so every job, run as: never the service's own,
so that no job reads the service's environment (``/proc/<pid>/environ``), database, secrets or
any other file of its.

Starting processes as another user needs root. As root, the service uses the user named by
``RLRUN_LOCAL_JOB_USER``, or makes one of its own (``default_name``: a system user, no home, no
login shell) the first time: ``rlrun-job-<instance>``, so that two services on one host never
share one. Not root and no user named: none (``resolve`` answers ``None``), and the caller
decides whether a single-tenant cluster is acceptable.
"""

from __future__ import annotations

import hashlib
import os
import pwd
import re
import stat
import subprocess
from dataclasses import dataclass
from pathlib import Path

PREFIX = "rlrun-job"
SETTING = "RLRUN_LOCAL_JOB_USER"
READ, WRITE, SEARCH = 4, 2, 1
NAME_MAX = 32  # useradd's limit


def default_name(instance: str, cluster: str | None = None) -> str:
    """The job user a service ``instance`` makes: ``rlrun-job-<instance>``, and for an
    embedded cluster of a clusters file ``rlrun-job-<instance>-<cluster>`` (the cluster's name
    as 8 hex digits of its digest when the whole would pass 32 characters)."""
    name = f"{PREFIX}-{instance}"
    if cluster is None:
        return name
    whole = f"{name}-{cluster.lower()}"
    if len(whole) <= NAME_MAX and re.fullmatch(r"[a-z0-9-]+", whole):
        return whole
    return f"{name}-{hashlib.sha256(cluster.encode()).hexdigest()[:8]}"


class JobUserError(RuntimeError):
    """The job user cannot be used (the message is one line, naming the setting)."""


@dataclass(frozen=True)
class JobUser:
    name: str
    uid: int
    gid: int

    def blocker(self, path: Path, want: int = READ) -> Path | None:
        """The first directory on the way to ``path`` this user may not search, or ``path``
        itself if it may not have ``want`` (READ, WRITE, SEARCH bits) on it; None if it may.
        Symbolic links are followed, their targets checked too."""
        path = Path(os.path.abspath(path))
        seen = Path("/")
        for part in path.parts[1:]:
            if not self._may(seen, SEARCH):
                return seen
            seen = seen / part
            if seen.is_symlink():
                target = seen.resolve()
                if (blocked := self.blocker(target.parent, SEARCH)) is not None:
                    return blocked
                seen = target
        return None if self._may(seen, want) else seen

    def _may(self, path: Path, want: int) -> bool:
        try:
            st = path.stat()
        except OSError:
            return False
        if st.st_uid == self.uid:
            bits = (st.st_mode >> 6) & 7
        elif st.st_gid in os.getgrouplist(self.name, self.gid):
            bits = (st.st_mode >> 3) & 7
        else:
            bits = st.st_mode & 7
        return bits & want == want

    def own(self, path: Path, mode: int = 0o700) -> None:
        """Give ``path`` (made by the service) to this user, with ``mode``."""
        os.chown(path, self.uid, self.gid)
        os.chmod(path, mode)


def resolve(named: str | None, default: str) -> JobUser | None:
    """The job user: the one named, else (as root) ``default``, made if missing; None when
    the service is not root and none is named."""
    if os.geteuid() != 0:
        if named:
            raise JobUserError(
                f"{SETTING}={named}: starting the nodes as another user needs the service to "
                "run as root"
            )
        return None
    name = named or default
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        if named:
            raise JobUserError(f"{SETTING}={named}: no such user") from None
        entry = _make(name)
    if entry.pw_uid == 0 or entry.pw_gid == 0:
        raise JobUserError(f"{SETTING}={name}: the job user may not be root or in root's group")
    return JobUser(name, entry.pw_uid, entry.pw_gid)


def _make(name: str) -> pwd.struct_passwd:
    done = subprocess.run(
        [
            "useradd",
            "--system",
            "--user-group",
            "--no-create-home",
            "--home-dir",
            "/nonexistent",
            "--shell",
            "/usr/sbin/nologin",
            name,
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode not in (0, 9):  # 9: made meanwhile by another start
        raise JobUserError(
            f"could not make the job user {name} ({done.stderr.strip()}); name one in {SETTING}"
        )
    return pwd.getpwnam(name)


def private_to_service(path: Path, user: JobUser) -> str | None:
    """Why ``path`` (a file or dir of the service's) is not out of the job user's reach, or
    None if it is (or does not exist)."""
    if not path.exists():
        return None
    if user.blocker(path, SEARCH if path.is_dir() else READ) is None:
        mode = stat.filemode(path.stat().st_mode)
        return f"{path} is readable by the job user {user.name} ({mode})"
    return None
