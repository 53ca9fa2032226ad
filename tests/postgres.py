"""Which PostgreSQL the tests use: ``RLRUN_TEST_PG``, else the server on 127.0.0.1 when one
answers there and lets them in, else a throwaway server of the session's own (pytest-postgresql's
executor driving the installed PostgreSQL binaries; ``.ci/run`` installs Debian's if missing).
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import stat
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from pytest_postgresql.executors import PostgreSQLExecutor
from sqlalchemy import create_engine, text
from sqlalchemy.exc import OperationalError

from service.store.db import upgrade
from tests.live import free_port

# Where a running server is looked for (the URL's database is the one the tests administer from).
PORT = int(os.environ.get("RLRUN_TEST_PG_PORT", "5432"))
RUNNING_URL = f"postgresql+psycopg://postgres@127.0.0.1:{PORT}/test"
# PostgreSQL refuses to run as root: then the throwaway server runs as this system user.
SERVER_USER = "postgres"


def answers(port: int, host: str = "127.0.0.1") -> bool:
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False


def accepts(url: str) -> bool:
    """Whether the server at ``url`` lets the tests in (a fresh Debian server asks a password)."""
    engine = create_engine(url, connect_args={"connect_timeout": 3})
    try:
        with engine.connect():
            return True
    except OperationalError:
        return False
    finally:
        engine.dispose()


def pg_ctl() -> str:
    """The newest installed ``pg_ctl`` (Debian keeps each major version apart)."""
    found = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"), key=lambda p: int(Path(p).parts[4])
    )
    path = found[-1] if found else shutil.which("pg_ctl")
    if path is None:
        raise RuntimeError(
            "no PostgreSQL: set RLRUN_TEST_PG, run a server on 127.0.0.1:5432, or install "
            "PostgreSQL's server binaries (apt-get install postgresql)"
        )
    return path


def _as_server_user(executable: str, workdir: Path) -> str:
    """As root: a ``pg_ctl`` that runs as ``SERVER_USER``, who then owns ``workdir``."""
    user = pwd.getpwnam(SERVER_USER)
    os.chown(workdir, user.pw_uid, user.pw_gid)
    wrapper = workdir / "pg_ctl"
    wrapper.write_text(f'#!/bin/sh\nexec runuser -u {SERVER_USER} -- "{executable}" "$@"\n')
    wrapper.chmod(stat.S_IRWXU | stat.S_IRGRP | stat.S_IXGRP | stat.S_IROTH | stat.S_IXOTH)
    return str(wrapper)


@contextmanager
def throwaway_server() -> Iterator[str]:
    """A new PostgreSQL server on a free port for as long as the block runs; its admin URL."""
    workdir = Path(tempfile.mkdtemp(prefix="rlrun-pg-"))
    executable = pg_ctl()
    if os.geteuid() == 0:
        executable = _as_server_user(executable, workdir)
    port = free_port()
    server = PostgreSQLExecutor(
        executable=executable,
        host="127.0.0.1",
        port=port,
        datadir=str(workdir / "data"),
        unixsocketdir=str(workdir),
        logfile=str(workdir / "server.log"),
        startparams="-w",
        dbname="postgres",
    )
    server.start()
    try:
        yield f"postgresql+psycopg://postgres@127.0.0.1:{port}/postgres"
    finally:
        server.stop()
        shutil.rmtree(workdir, ignore_errors=True)


@contextmanager
def fresh_database(admin: str, prefix: str) -> Iterator[str]:
    """A new database on the server of ``admin`` (a URL), migrated to head; dropped after."""
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    engine = create_engine(admin, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    url = admin.rsplit("/", 1)[0] + f"/{name}"
    upgrade(url)
    try:
        yield url
    finally:
        with engine.connect() as conn:
            conn.execute(text(f'DROP DATABASE "{name}" WITH (FORCE)'))
        engine.dispose()


@contextmanager
def admin_url() -> Iterator[str]:
    if url := os.environ.get("RLRUN_TEST_PG"):
        yield url
    elif answers(PORT) and accepts(RUNNING_URL):
        yield RUNNING_URL
    else:
        with throwaway_server() as url:
            yield url
