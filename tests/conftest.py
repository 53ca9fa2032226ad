"""Shared fixtures: one local Ray cluster per session, SQLite and PostgreSQL databases, apps."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import time
from collections.abc import Callable, Collection, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, text
from typer.testing import CliRunner

from service import listeners
from service.app import create_app
from service.cluster.local_ray import LocalRayCluster
from service.cluster.ray_jobs import RayJobs
from service.settings import Settings
from service.store.db import Database, upgrade
from service.store.models import Base
from service.store.status import TERMINAL as TERMINAL
from service.store.tokens import Role
from service.store.tokens import create as create_token
from tests import postgres
from tests.live import ServerThread

# The session's one real verl run, for every test file that asks for it (tests/verl_run.py);
# the browser tests' Chromium and page (tests/browser.py); each test's lane and time, where
# RLRUN_TEST_TIMES names a file (tests/timing.py).
pytest_plugins = ["tests.verl_run", "tests.browser", "tests.timing"]

# Tests change runs through the lifecycle without an app as well: its listeners, as at start.
listeners.register()

# An xdist worker starts with COLUMNS=80 in its environment, which the CLI's console would keep
# as its width for every test (its width is read once, when it is made): the tests set their own.
if "PYTEST_XDIST_WORKER" in os.environ:
    os.environ.pop("COLUMNS", None)
# The name TestClient sends as Host: answered in open mode as a loopback name is.
os.environ.setdefault("RLRUN_OPEN_MODE_HOSTS", '["testserver"]')
# Ports for the session's Ray cluster (it and the tests' own heads use up to RAY_PORT + 3000):
# outside 10002-19999, which Ray keeps for its workers, and below the system's ephemeral ports
# (32768 and up), which any outgoing connection may hold. Each xdist worker has a range of its
# own, 3000 ports above the last, and hands it to the processes it starts (benchmarks read it).
RAY_PORT = int(os.environ.get("RLRUN_TEST_RAY_PORT", "20379")) + 3000 * int(
    os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
)
os.environ["RLRUN_TEST_RAY_PORT"] = str(RAY_PORT)
# Ray's auth token of each cluster handle the tests started, by dashboard address: settings and
# clients made for that address take it from there.
RAY_TOKENS: dict[str, str] = {}


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The layers: a test on the session's Ray cluster is marked ``ray`` and ``slow`` (starting
    Ray and running jobs takes seconds), so ``-m "not slow"`` is the fast layer: unit tests with
    an in-memory Ray, and the API on SQLite and PostgreSQL.

    The lanes, for ``pytest -n 2 --dist loadgroup`` (.ci/run): the tests of a module marked
    ``ray`` (the session's cluster, a head of its own, a service's embedded head) run on one
    worker, so that its module fixtures start once (each worker has a Ray cluster and a range of
    ports of its own); the real verl runs' tests (``verl_lock``) run on one worker (one shared
    run a session, one verl run at a time); the rest spread over the workers. The longest lanes
    are handed out first (the verl lane, then the Ray modules): one left for last would run
    alone at the end. The order within a lane, and within a module, is kept, except that the
    verl lane runs the shared run's tests before the tests with a verl run of their own."""
    lanes: dict[str, tuple[int, int]] = {}
    for item in items:
        names = getattr(item, "fixturenames", ())
        if "ray_cluster" in names:
            item.add_marker(pytest.mark.ray)
            item.add_marker(pytest.mark.slow)
        if "verl_lock" in names:  # the shared verl run's tests, and any real verl run's
            item.add_marker(pytest.mark.xdist_group("verl"))
            # The shared run's readers first: its service stops after the last of them.
            lanes[item.nodeid] = (0, 0 if "verl_run" in names else 1)
        elif item.get_closest_marker("ray") is not None:
            item.add_marker(pytest.mark.xdist_group(f"ray-{item.path.stem}"))
            lanes[item.nodeid] = (1, 0)
    items.sort(key=lambda item: lanes.get(item.nodeid, (2, 0)))


# The session's cluster once made: stopped once this worker's Ray lane is done.
_SESSION_CLUSTER: list[LocalRayCluster] = []


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[LocalRayCluster]:
    """Two virtual nodes with 8 NPUs each: placement and queueing are real, no device is used."""
    cluster = LocalRayCluster(
        [8, 8], cpus_per_node=8, port=RAY_PORT, dashboard_port=RAY_PORT + 2000
    )
    cluster.start()
    RAY_TOKENS[cluster.address] = cluster.token
    _SESSION_CLUSTER.append(cluster)
    yield cluster
    _SESSION_CLUSTER.clear()
    RAY_TOKENS.pop(cluster.address, None)
    cluster.cleanup()


def pytest_runtest_setup(item: pytest.Item) -> None:
    """The session's cluster, if it was stopped (``pytest_runtest_teardown``), starts again (the
    same ports and token) for a test that asks for it."""
    if "ray_cluster" in getattr(item, "fixturenames", ()):
        for cluster in _SESSION_CLUSTER:
            if not cluster.running:
                cluster.start()


@pytest.hookimpl(trylast=True)  # after the test's own fixtures are torn down
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """Stop the session's cluster once the Ray lane is behind this worker: the lanes are handed
    out in order (``pytest_collection_modifyitems``), so a worker whose next test is not marked
    ``ray`` gets no Ray test after it, and idle, the cluster's nodes would take CPU from every
    test until the session ends."""
    if nextitem is None or nextitem.get_closest_marker("ray") is None:
        for cluster in _SESSION_CLUSTER:
            if cluster.running:
                cluster.stop()


@pytest.fixture
def ray(ray_cluster: LocalRayCluster) -> Iterator[RayJobs]:
    client = RayJobs(ray_cluster.address, ray_cluster.token)
    earlier = {job.submission_id for job in client.list_jobs()}
    yield client

    # Leave the shared cluster idle for the next test: this test's jobs stopped and ended. (A
    # job an earlier test left, e.g. one that can never be placed, was that test's to wait
    # for: waiting for it again would cost every later test the whole 30 s.)
    def live() -> list[str]:
        return [
            j.submission_id
            for j in client.list_jobs()
            if j.status in {"PENDING", "RUNNING"} and j.submission_id not in earlier
        ]

    for job_id in live():
        client.stop(job_id)
    deadline = time.monotonic() + 30
    while live() and time.monotonic() < deadline:
        time.sleep(0.5)
    client.close()


@pytest.fixture(scope="session")
def pg_admin_url() -> Iterator[str]:
    """``RLRUN_TEST_PG``, the server on 127.0.0.1:5432, or a throwaway one (tests/postgres.py)."""
    with postgres.admin_url() as url:
        yield url


@pytest.fixture(scope="session")
def pg_database(pg_admin_url: str) -> Iterator[str]:
    """A fresh PostgreSQL database for this session, migrated to head, dropped at the end."""
    with postgres.fresh_database(pg_admin_url, "rlrun_test") as url:
        yield url


def _truncate(url: str) -> None:
    engine = create_engine(url)
    with engine.begin() as conn:
        names = ", ".join(t.name for t in Base.metadata.sorted_tables)
        conn.execute(text(f"TRUNCATE {names} CASCADE"))
    engine.dispose()


@pytest.fixture(scope="session")
def sqlite_migrated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SQLite file migrated to head once per session (the whole chain costs about a third of
    a second of CPU, which hundreds of tests would pay again)."""
    path = tmp_path_factory.mktemp("migrated") / "rlrun.db"
    upgrade(f"sqlite:///{path}")
    return path


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db_url(request: pytest.FixtureRequest, tmp_path: Any) -> str:
    """Each test that takes this runs once on SQLite and once on PostgreSQL, on a database
    migrated to head (a copy of the session's migrated file; emptied tables on PostgreSQL)."""
    if request.param == "sqlite":
        return _migrated_copy(request.getfixturevalue("sqlite_migrated"), Path(tmp_path))
    url: str = request.getfixturevalue("pg_database")
    _truncate(url)
    return url


def _migrated_copy(migrated: Path, tmp_path: Path) -> str:
    """The URL of a copy of the session's migrated SQLite file in ``tmp_path``."""
    path = tmp_path / "rlrun.db"
    with (
        contextlib.closing(sqlite3.connect(migrated)) as src,
        contextlib.closing(sqlite3.connect(path)) as dst,
    ):
        src.backup(dst)
    return f"sqlite:///{path}"


@pytest.fixture
def sqlite_db(tmp_path: Path, sqlite_migrated: Path) -> Iterator[Database]:
    """A migrated SQLite database of the test's own, for a test with no PostgreSQL twin (a
    browser on a live service, say)."""
    database = Database(_migrated_copy(sqlite_migrated, tmp_path))
    yield database
    database.dispose()


@pytest.fixture
def db(db_url: str) -> Iterator[Database]:
    """A migrated database on each backend, for tests that use the store directly."""
    upgrade(db_url)
    database = Database(db_url)
    yield database
    database.dispose()


@contextlib.contextmanager
def group_a_cluster(
    tmp_path: Path, offset: int, npus: list[int], db_name: str
) -> Iterator[tuple[LocalRayCluster, Settings]]:
    """A Ray head of its own (ports ``RAY_PORT + offset``) whose first node carries the node
    group "group-a", mapped to team vision, and the settings of a service on it (SQLite file
    ``db_name``); the cluster is started (slowly on a loaded machine) and cleaned up after."""
    port = RAY_PORT + offset
    cluster = LocalRayCluster(
        npus,
        cpus_per_node=4,
        port=port,
        dashboard_port=port + 2000,
        custom_resources=[{"group-a": 1000.0}, {}],
    )
    settings = make_settings(
        f"sqlite:///{tmp_path}/{db_name}",
        cluster.address,
        team_nodes={"vision": "group-a"},
        inventory_ttl_s=0.5,
        ray_token=cluster.token,
    )
    try:
        cluster.start(timeout_s=240)
        yield cluster, settings
    finally:
        cluster.cleanup()


@contextlib.contextmanager
def auth_on(db_url: str, *users: tuple[str, str, Role]) -> Iterator[tuple[TestClient, list[Any]]]:
    """The API with authentication on (no loops, no Ray), and a token per ``(user, team,
    role)``: each as ``(row, secret)``, in order."""
    upgrade(db_url)
    db = Database(db_url)
    with db.transaction() as s:
        made = [create_token(s, user, team, role) for user, team, role in users]
    db.dispose()
    settings = make_settings(db_url, "http://127.0.0.1:9", run_loops=False, auth="on")
    with TestClient(create_app(settings)) as client:
        yield client, made


@contextlib.contextmanager
def served(db_url: str, **overrides: Any) -> Iterator[str]:
    """The service over HTTP on ``db_url`` with no loops and no reachable Ray (``overrides`` of
    its settings): its base URL."""
    settings = make_settings(db_url, "http://127.0.0.1:9", run_loops=False, **overrides)
    with ServerThread(create_app(settings)) as url:
        yield url


def cli_on(db_url: str, monkeypatch: pytest.MonkeyPatch) -> CliRunner:
    """A runner of the ``rlrun`` command on the (migrated) database ``db_url``."""
    upgrade(db_url)
    monkeypatch.setenv("RLRUN_DATABASE_URL", db_url)
    return CliRunner()


TEST_INSTANCE = "test"


def make_settings(db_url: str, ray_address: str, **overrides: Any) -> Settings:
    defaults: dict[str, Any] = {
        "database_url": db_url,
        "ray_address": ray_address,
        "submit_interval_s": 0.3,
        "reconcile_interval_s": 0.3,
        "max_backoff_s": 2.0,
        "recipe_plugins": "tests.recipes:register",
        "ray_token": RAY_TOKENS.get(ray_address),
        # One job user (rlrun-job-test) and run root for every test's service, not one a database.
        "instance": TEST_INSTANCE,
    }
    return Settings(**(defaults | overrides))


@pytest.fixture
def api(db_url: str) -> Iterator[TestClient]:
    """The API without background loops or a reachable Ray: requests and the database only."""
    settings = make_settings(db_url, "http://127.0.0.1:9", run_loops=False)
    with TestClient(create_app(settings)) as client:
        yield client


@pytest.fixture
def service_factory(ray_cluster: LocalRayCluster, ray: RayJobs) -> Callable[..., TestClient]:
    """Build a full service (loops on) against the session's Ray cluster."""

    def make(db_url: str, **overrides: Any) -> TestClient:
        address = overrides.pop("ray_address", ray_cluster.address)
        return TestClient(create_app(make_settings(db_url, address, **overrides)))

    return make


@pytest.fixture
def sqlite_service(
    service_factory: Callable[..., TestClient], tmp_path: Any
) -> Callable[..., TestClient]:
    """``service_factory`` on this test's own SQLite file (the same file on every call)."""
    return lambda **overrides: service_factory(f"sqlite:///{tmp_path}/db.sqlite", **overrides)


def assert_refused_naming(resp: httpx.Response, field: str) -> None:
    """A 422 problem+json whose errors name ``field`` (a dotted path)."""
    assert resp.status_code == 422, resp.text
    assert resp.headers["content-type"] == "application/problem+json"
    assert field in {e["field"] for e in resp.json()["errors"]}, resp.json()


def submit(client: TestClient, **spec: Any) -> str:
    """POST a ``test-script`` run (tests/recipes.py); its id."""
    resp = client.post("/runs", json={"recipe": "test-script", **spec})
    assert resp.status_code == 201, resp.text
    run_id: str = resp.json()["id"]
    return run_id


def wait_for(
    fetch: Callable[[], Any], done: Callable[[Any], bool], timeout: float = 60.0, every: float = 0.2
) -> Any:
    """Poll ``fetch`` until ``done(value)``; fail with the last value on timeout."""
    deadline = time.monotonic() + timeout
    value = fetch()
    while not done(value):
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s; last value: {value!r}")
        time.sleep(every)
        value = fetch()
    return value


def transitions(run: dict[str, Any]) -> list[str]:
    """The statuses a run's events moved it to, in order; notes (same status) left out."""
    return [e["to_status"] for e in run["events"] if e["from_status"] != e["to_status"]]


def wait_status(
    client: TestClient | httpx.Client, run_id: str, statuses: Collection[str], timeout: float = 60.0
) -> dict[str, Any]:
    run: dict[str, Any] = wait_for(
        lambda: client.get(f"/runs/{run_id}").json(),
        lambda r: r["status"] in statuses,
        timeout,
    )
    return run
