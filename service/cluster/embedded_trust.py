"""Who the embedded cluster's jobs run as, decided and checked before its nodes start.

As root (or with ``RLRUN_LOCAL_JOB_USER``), the nodes run as the job user (``job_user``), with a
Python it can run (``job_python``). The service's own files are then made or checked to be out
of its reach: the SQLite database (mode 0600, which SQLite's journal files take too) and the
secrets dir (refused if that user can enter it), while the run dirs the service makes are that
user's; a run dir that exists already (a shared checkpoint root) is never taken over. Not root
and no job user named: the nodes run as the service's own user, which with authentication on is
refused unless ``RLRUN_LOCAL_SINGLE_TENANT`` accepts it.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy.engine import make_url

from service.cluster.job_python import JobPython, for_user
from service.cluster.job_user import (
    READ,
    SEARCH,
    WRITE,
    JobUser,
    default_name,
    private_to_service,
    resolve,
)
from service.settings import Settings

log = logging.getLogger(__name__)
SINGLE_TENANT = "RLRUN_LOCAL_SINGLE_TENANT"


class StartRefused(RuntimeError):
    """The embedded cluster may not start so (the message is one line, naming the setting)."""


@dataclass(frozen=True)
class EmbeddedTrust:
    user: JobUser | None
    python: JobPython

    @property
    def jobs_act_as_service(self) -> bool:
        return self.user is None


def prepare(
    settings: Settings,
    run_dirs: Sequence[Path] = (),
    named: str | None = None,
    default: str = "",
    made: set[Path] | None = None,
) -> EmbeddedTrust:
    """An embedded cluster's user (``named``, else ``default``, as root) and Python, the
    service's files out of that user's reach and ``run_dirs`` within it where the service makes
    them; ``StartRefused`` if that cannot be.

    A run dir that is missing is made here and given to the user (mode 0700), or, made for
    another embedded cluster's user at this start (``made``, shared by the calls of one start),
    opened to each (1777: each user's runs keep their own dirs in it). One that exists already
    is not the service's to give (a shared checkpoint root, the operator's, an earlier start's):
    it keeps its owner and mode, and a warning says when the user cannot write it."""
    made = set() if made is None else made
    user = resolve(named, default or default_name(settings.instance_name))
    if user is None:
        if settings.auth_enabled and not settings.local_single_tenant:
            raise StartRefused(
                "authentication is on, but the embedded cluster's jobs would run as the "
                "service's own user (it is not root and RLRUN_LOCAL_JOB_USER is unset), so any "
                f"job could act as the service; set {SINGLE_TENANT}=true to accept that"
            )
        if settings.local_single_tenant:
            log.warning(
                "single-tenant embedded cluster (%s): every job runs as the service's own "
                "user, reads its environment, database and secrets: every job can act as the "
                "service",
                SINGLE_TENANT,
            )
        return EmbeddedTrust(None, for_user(None))
    _keep_database(settings)
    if settings.secrets_dir and (why := private_to_service(Path(settings.secrets_dir), user)):
        raise StartRefused(f"RLRUN_SECRETS_DIR: {why}; make it mode 0700")
    for path in run_dirs:
        if not path.exists():
            try:
                path.mkdir(parents=True)
            except OSError as exc:
                log.warning("cannot make %s for the embedded cluster's runs: %s", path, exc)
                continue
            made.add(path)
        if path not in made:
            continue
        if path.stat().st_uid == os.geteuid():
            user.own(path)
        elif path.stat().st_uid != user.uid:
            # Another embedded cluster's user has it: each user's runs keep their own dirs in it.
            path.chmod(0o1777)
    _say_unreachable(settings, user, [p for p in run_dirs if p not in made])
    python = for_user(user)
    log.info("the embedded cluster's jobs run as %s (Python %s)", user.name, python.executable)
    return EmbeddedTrust(user, python)


def _say_unreachable(settings: Settings, user: JobUser, kept: Sequence[Path]) -> None:
    """A warning for each verl dir, and each run dir kept as it was (``kept``), that the job
    user cannot use (its runs would fail there)."""
    wanted = {settings.verl_data_dir: "read", settings.verl_model_dir: "read"}
    wanted |= {str(path): "write" for path in kept}
    for path, how in wanted.items():
        want = SEARCH | (WRITE if how == "write" else READ)
        if Path(path).exists() and (blocked := user.blocker(Path(path), want)) is not None:
            log.warning(
                "the embedded cluster's jobs run as %s, which cannot %s %s (blocked at %s): "
                "verl runs that use it will fail",
                user.name,
                how,
                path,
                blocked,
            )


def _keep_database(settings: Settings) -> None:
    """A SQLite database (and its journals, which take its mode) readable by the service only."""
    url = make_url(settings.database_url.get_secret_value())
    if not url.drivername.startswith("sqlite") or not url.database or url.database == ":memory:":
        return
    path = Path(url.database)
    if not path.exists():
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600))
    for name in (path, *(path.with_name(path.name + s) for s in ("-wal", "-shm", "-journal"))):
        if name.exists():
            name.chmod(0o600)
