"""The one real verl run of a test session, shared by every test file that asks about it.

A real run of verl's own fully async trainer (preset ``cpu-learn`` of ``verl-fully-async``, on
CPU, on the embedded local Ray head of a real service process: the seed's recipe in miniature,
whose reward rises) costs minutes and peaks near 11 GB. So a session makes exactly one, the
first time a test asks for it, and keeps its service up until the last test that asks for it
is done (they run first in the verl lane): every test about verl-for-real asks this run what
it wants to know. CI pays for one run; add assertions, not runs.

The fixtures (session-scoped; registered for every test file by ``tests/conftest.py``):

- ``verl_run`` (``VerlRun``): the run, ended (waited for up to ``RUN_TIMEOUT_S``): ``run_id``,
  ``run`` (the final ``GET /runs/{id}`` JSON), ``root`` (its data, checkpoints, database, the
  service's log), ``checkpoints`` (the run's own ``trainer.default_local_dir``), ``service``
  (the ``ServiceProcess``, still up), ``http`` (an ``httpx.Client`` on its base URL), and
  ``ray_address`` with ``ray_token()`` (the embedded Ray head's Jobs API, e.g. for ``RayJobs``);
- ``verl_http``: that client, for ``GET /runs/{id}``, ``/events``, ``/metrics``, ``/logs``,
  ``/script`` and the rest;
- ``verl_lock``: the host's verl lock, for a test that makes a real verl run of its own (a
  service from ``start_service``, on ports of the session's range that no other test uses).

A test file uses them so::

    pytestmark = [pytest.mark.slow, pytest.mark.ray, pytest.mark.timeout(2400)]

    def test_something_of_the_real_run(verl_run: VerlRun) -> None:
        series = verl_run.http.get(f"/runs/{verl_run.run_id}/metrics").json()["series"]
        assert ...

A test that asks for the run waits for it to end; the first one pays for it (its timeout must
cover a run: ``pytest.mark.timeout(2400)``). A test must not change the run (cancel it, retry
it) or the service; one that needs a run of its own asks for ``verl_lock`` and pays for its
run in CI. A session that collects a test asking for the lock (``verl_run`` does) takes the
host's verl lock (``flock`` on ``LOCK``, as every real verl run here does) once collection
ends, before any test's timeout runs (another session's verl run may hold it for many minutes),
and holds it to the session's end: two sessions never run verl at once.

Slow, and it needs the trainer stack (rlrun[verl-cpu], README): without it the run fails, the
tests fail, never skip.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import httpx
import pytest

from service.recipes.verl.preset import LEARN_DIR, SMOKE_DIR
from tests.conftest import RAY_PORT
from tests.service_process import ServiceProcess

LOCK = Path("/tmp/rlrun-verl-real.lock")
RUN_TIMEOUT_S = 1800
TERMINAL = ("SUCCEEDED", "FAILED", "CANCELLED", "STOPPED", "LOST")
# The run's request: the preset as a user posts it.
REQUEST: dict[str, Any] = {"recipe": "verl-fully-async", "preset": "cpu-learn", "name": "cpu-learn"}
RAY_DIR = "r"  # the embedded head's dir under the root (short: Ray's socket paths are bounded)
# The shared run's head and dashboard ports (offsets from RAY_PORT): none a Ray-lane test uses.
PORTS = (1500, 1600)


@dataclass(frozen=True)
class VerlRun:
    """The session's real verl run, ended, on a service still up."""

    service: ServiceProcess
    http: httpx.Client
    root: Path
    run_id: str
    run: dict[str, Any]
    # Seconds from POST /runs to the run's end, as this session saw them.
    seconds: float

    @property
    def checkpoints(self) -> Path:
        """The run's own checkpoint dir (``trainer.default_local_dir``)."""
        return self.root / "checkpoints" / self.run_id

    @property
    def data(self) -> Path:
        """The assets (model, tokenizer, parquet data) the run read."""
        return self.root / "data" / LEARN_DIR

    @property
    def ray_address(self) -> str:
        """The embedded Ray head's dashboard (Jobs API)."""
        return f"http://127.0.0.1:{RAY_PORT + PORTS[1]}"

    def ray_token(self) -> str:
        """That head's auth token (in its dir, the job user's; the tests run as root)."""
        return (self.root / RAY_DIR / "ray-token").read_text().strip()


def start_service(
    prefix: str, ports: tuple[int, int] = PORTS, learn: bool = False
) -> tuple[Path, ServiceProcess]:
    """A new root (the smoke assets in it, or with ``learn`` cpu-learn's) and a service on an
    embedded head of its own, started.
    The root is where the embedded nodes' own user (the service runs as root) reads data and
    writes checkpoints: not in pytest's private temp dir. The checkpoint root is the service's
    to make at start (for that user); one that exists is not taken over. ``ports``: the head's
    and its dashboard's, as offsets from ``RAY_PORT`` (a service beside the shared run's needs
    others)."""
    from jobs.verl_cpu import assets

    root = Path(tempfile.mkdtemp(prefix=prefix))
    root.chmod(0o755)
    if learn:  # as the README makes them
        cli = [sys.executable, "-m", "service.cli", "verl", "make-smoke-assets", "--learn"]
        subprocess.run([*cli, str(root / "data" / LEARN_DIR)], check=True, timeout=600)
    else:
        assets.make(root / "data" / SMOKE_DIR)
    service = _service(root, ports, cluster_defaults=learn)
    service.start(timeout=180)
    return root, service


def _service(
    root: Path, ports: tuple[int, int] = PORTS, cluster_defaults: bool = False
) -> ServiceProcess:
    """A service on an embedded head of 2 NPU slots, or with ``cluster_defaults`` the default
    embedded cluster (16 NPUs, 64 logical CPUs: what `rlrun serve` starts), on ``ports``."""
    service = ServiceProcess("sqlite:///" + str(root / "db.sqlite"), "local", root / "s.log")
    data = root / "data"
    if not cluster_defaults:  # two slots: a run of 1 + 1 fills the cluster
        service.env |= {"RLRUN_LOCAL_NPUS": "2"}
    service.env |= {
        "RLRUN_LOCAL_RAY_STATE_DIR": str(root / "state"),
        "RLRUN_LOCAL_RAY_DIR": str(root / RAY_DIR),
        # Ports of this session's range (conftest: RAY_PORT..RAY_PORT+3000), not random free ones
        # that another process may take between choosing and binding; none the Ray lane's tests
        # use (the run's service is up while they run, beside it under xdist).
        "RLRUN_LOCAL_RAY_PORT": str(RAY_PORT + ports[0]),
        "RLRUN_LOCAL_DASHBOARD_PORT": str(RAY_PORT + ports[1]),
        "RLRUN_VERL_DATA_DIR": str(data),
        "RLRUN_VERL_MODEL_DIR": str(data),
        "RLRUN_VERL_CHECKPOINT_ROOT": str(root / "checkpoints"),
    }
    return service


@contextmanager
def own_service(
    prefix: str, ports: tuple[int, int], learn: bool = False
) -> Iterator[tuple[Path, ServiceProcess]]:
    """``start_service`` for a test's own verl run: the service stops after the block; its root
    goes if the block passed, and is kept (and named) if it failed."""
    root, service = start_service(prefix, ports, learn)
    passed = False
    try:
        yield root, service
        passed = True
    finally:
        service.stop()  # before its root goes: its Ray head's files are there
        if passed:
            shutil.rmtree(root, ignore_errors=True)
        else:
            print(f"kept {root} (its service's log s.log, the run's checkpoints)")


def wait_end(http: httpx.Client, run_id: str, timeout_s: float = RUN_TIMEOUT_S) -> dict[str, Any]:
    """The run's document once it has ended (polled every 2 s for ``timeout_s``)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        run: dict[str, Any] = http.get(f"/runs/{run_id}").json()
        if run["status"] in TERMINAL:
            return run
        time.sleep(2)
    raise AssertionError(f"run {run_id} did not end in {timeout_s:g} s")


_HELD = pytest.StashKey[IO[str]]()


def pytest_collection_finish(session: pytest.Session) -> None:
    """Take the host's verl lock once a test this session selected asks for it (after
    ``-m``/``-k`` deselect: the fast layer never waits for it). Under xdist every worker
    collects every test, and the first worker takes it for the whole session: whichever worker
    runs the verl lane is covered, and no two workers of one session wait for each other."""
    config = session.config
    wants = any("verl_lock" in getattr(item, "fixturenames", ()) for item in session.items)
    first = os.environ.get("PYTEST_XDIST_WORKER", "gw0") == "gw0"
    if wants and first and _HELD not in config.stash and not config.option.collectonly:
        lock = LOCK.open("w")
        fcntl.flock(lock, fcntl.LOCK_EX)
        config.stash[_HELD] = lock


# The shared run's service while it is up: stopped after the last test that reads it.
_SHARED: list[ServiceProcess] = []


@pytest.hookimpl(trylast=True)  # after the test's own fixtures are torn down
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """Stop the shared run's service (and its Ray head) once the last test that reads it is
    done (they run first in the verl lane, ``tests/conftest.py``): idle, it would take CPU from
    every test after it until the session ends."""
    uses = "verl_run" in getattr(item, "fixturenames", ())
    if uses and "verl_run" not in getattr(nextitem, "fixturenames", ()):
        while _SHARED:
            _SHARED.pop().stop()


def pytest_unconfigure(config: pytest.Config) -> None:
    lock = config.stash.get(_HELD, None)
    if lock is not None:
        lock.close()  # the lock goes with its file


@pytest.fixture(scope="session")
def verl_lock(pytestconfig: pytest.Config) -> None:
    """The host's verl lock, held for this session: what every test that starts a real verl run
    asks for (``verl_run`` does), and what puts it in the verl lane (``tests/conftest.py``).
    Taken at collection (a session that selects no such test takes none), by this process or,
    under xdist, by the session's first worker."""
    held = _HELD in pytestconfig.stash or os.environ.get("PYTEST_XDIST_WORKER", "gw0") != "gw0"
    assert held, f"the verl lock {LOCK} is not held"


@pytest.fixture(scope="session")
def verl_run(verl_lock: None) -> Iterator[VerlRun]:
    root, service = start_service("rlrun-verl-real-", learn=True)
    _SHARED.append(service)
    try:
        with httpx.Client(base_url=service.url, timeout=30) as http:
            started = time.monotonic()
            resp = http.post("/runs", json=REQUEST)
            assert resp.status_code == 201, resp.text
            run_id = resp.json()["id"]
            run = wait_end(http, run_id)
            seconds = time.monotonic() - started
            (root / "run.json").write_text(json.dumps(run, indent=2))
            print(f"\nthe session's verl run {run_id}: {run['status']} in {seconds:.0f} s")
            if run["status"] != "SUCCEEDED":  # what a red run needs (the root goes at the end)
                print(json.dumps({k: run.get(k) for k in ("attempts", "events")})[:20_000])
                print(http.get(f"/runs/{run_id}/logs", params={"tail": 300}).text[-30_000:])
            yield VerlRun(service, http, root, run_id, run, seconds)
    finally:
        service.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def verl_http(verl_run: VerlRun) -> httpx.Client:
    return verl_run.http
