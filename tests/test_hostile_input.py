"""Input one database would take and the other refuse, fed to both; every error a problem.

The same hostile requests and job logs go to SQLite and PostgreSQL (``db_url``): each is refused
at the door with a 422 naming the field, or stored alike on both without blocking anything else.
"""

from __future__ import annotations

import logging
from typing import Any, cast

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import select

from service.app import create_app
from service.cluster.ray_jobs import RayJobs
from service.loops.follower import Follower
from service.metrics import logcopy, store
from service.metrics.health import HealthRules
from service.metrics.log_readers import WholeLogReader
from service.store.db import Database
from service.store.models import Run, RunEvent, RunLog
from service.store.status import RunStatus
from tests.conftest import make_settings
from tests.factories import add_run
from tests.test_metric_store import points

PROBLEM = "application/problem+json"

REFUSED: list[tuple[str, bytes, str]] = [
    ("nul in the name", b'{"recipe": "test-script", "name": "a\\u0000b"}', "name"),
    ("escape in the name", b'{"recipe": "test-script", "name": "\\u001b[31mred"}', "name"),
    ("line break in the name", b'{"recipe": "test-script", "name": "a\\nb"}', "name"),
    ("nul in free text", b'{"recipe": "test-script", "message": "x\\u0000"}', "message"),
    ("lone surrogate", b'{"recipe": "test-script", "message": "\\ud800"}', "message"),
    (
        "bell in a nested key",
        b'{"recipe": "test-script", "groups": [{"r\\u0007": 1}]}',
        "groups[0]",
    ),
    ("Infinity", b'{"recipe": "test-script", "seconds": Infinity}', "seconds"),
    ("-Infinity", b'{"recipe": "test-script", "seconds": -Infinity}', "seconds"),
    ("NaN", b'{"recipe": "test-script", "seconds": NaN}', "seconds"),
]


@pytest.mark.parametrize(("case", "body", "field"), REFUSED, ids=[c[0] for c in REFUSED])
def test_unstorable_input_is_a_422_naming_the_field_on_both_databases(
    api: TestClient, case: str, body: bytes, field: str
) -> None:
    resp = api.post("/runs", content=body, headers={"content-type": "application/json"})
    assert resp.status_code == 422, (case, resp.text)
    assert resp.headers["content-type"] == PROBLEM
    assert resp.json()["errors"][0]["field"].startswith(field)
    assert api.get("/runs").json()["items"] == []


def test_text_both_databases_store_is_stored_alike(api: TestClient) -> None:
    name = "模型-run ✓ \u00e9t\u00e9"
    resp = api.post("/runs", json={"recipe": "test-script", "name": name, "message": "a\tb\nc"})
    assert resp.status_code == 201, resp.text
    assert api.get(f"/runs/{resp.json()['id']}").json()["name"] == name


def test_a_20_mb_body_is_a_413_problem(api: TestClient) -> None:
    body = b'{"recipe": "test-script", "message": "' + b"x" * 20_000_000 + b'"}'
    resp = api.post("/runs", content=body, headers={"content-type": "application/json"})
    assert resp.status_code == 413
    assert resp.headers["content-type"] == PROBLEM
    assert resp.json()["type"] == "urn:rlrun:problem:content-too-large"

    def chunks() -> Any:  # no Content-Length: the limit applies to what is streamed
        for _ in range(40):
            yield b" " * 500_000

    streamed = api.post("/runs", content=chunks(), headers={"content-type": "application/json"})
    assert streamed.status_code == 413 and streamed.headers["content-type"] == PROBLEM


@pytest.mark.parametrize(
    ("method", "path", "status", "kind"),
    [
        ("GET", "/no/such/route", 404, "not-found"),
        ("DELETE", "/runs", 405, "method-not-allowed"),
        ("GET", "/runs?limit=0", 422, "invalid-run-spec"),
    ],
)
def test_framework_errors_are_typed_problems(
    api: TestClient, method: str, path: str, status: int, kind: str
) -> None:
    resp = api.request(method, path)
    assert resp.status_code == status
    assert resp.headers["content-type"] == PROBLEM
    assert resp.json()["type"] == f"urn:rlrun:problem:{kind}"


def test_an_unexpected_exception_is_a_500_problem_whose_id_is_logged_with_the_traceback(
    db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    app: FastAPI = create_app(make_settings(db_url, "http://127.0.0.1:9", run_loops=False))

    def boom() -> None:
        raise RuntimeError("a bug")

    app.add_api_route("/boom", boom)
    with TestClient(app, raise_server_exceptions=False) as client, caplog.at_level(logging.ERROR):
        resp = client.get("/boom")
    assert resp.status_code == 500
    assert resp.headers["content-type"] == PROBLEM
    problem = resp.json()
    assert problem["type"] == "urn:rlrun:problem:internal-error"
    logged = [r for r in caplog.records if problem["error_id"] in r.getMessage()]
    assert logged and logged[0].exc_info is not None
    assert "a bug" in str(logged[0].exc_info[1])


class LogOf:
    """Ray's answer for a job log: the text a job printed (the rest of the follower is real)."""

    def __init__(self, text: str) -> None:
        self.text = text

    def logs(self, _run_id: str) -> str:
        return self.text


def test_a_hostile_job_log_is_stored_alike_and_blocks_none_of_the_runs_points(
    db_url: str, api: TestClient
) -> None:
    db = Database(db_url)
    run_id = add_run(db, "r-hostile")
    long_key = "k" * 300
    log = (
        "step:1 - a:1.0 - b:2.0\n"
        f"step:2 - a:1.5 - {long_key}:3.0\n"  # the long key is dropped, a is kept
        "step:3000000000 - a:2.0\n"  # above 2^31: kept
        f"step:{2**64} - a:9.0\n"  # above the column: dropped
        "a NUL \x00 and a surrogate \ud800 in plain output\n"
        "step:4 - a\x00b:1.0\n"  # a key with NUL: not a metric line
        "step:5 - a:3.0\n"
    )
    ray = cast(RayJobs, LogOf(log))
    follower = Follower(db, ray, "me", 30.0, 10_000, HealthRules(), reader=WholeLogReader(ray))
    for _ in range(2):  # the second read finds nothing new and notes nothing twice
        follower.tick()
    stored = points(db, run_id)
    with db.transaction() as s:
        runlog = s.get(RunLog, run_id)
        reasons = s.scalars(select(RunEvent.reason).where(RunEvent.run_id == run_id)).all()
        copy = logcopy.tail(s, run_id, None)
    db.dispose()
    assert stored == [
        (1, "a", 1.0),
        (1, "b", 2.0),
        (2, "a", 1.5),
        (5, "a", 3.0),
        (3_000_000_000, "a", 2.0),
    ]
    assert runlog is not None and runlog.log_offset == len(log)
    assert runlog.last_step == 3_000_000_000
    assert sum(r.startswith(store.LONG_KEY) for r in reasons) == 1
    assert sum(r.startswith(store.BIG_STEP) for r in reasons) == 1
    assert len(copy) == len(log) and "\x00" not in copy and "\ufffd" in copy


def test_ray_text_with_nul_is_stored_alike(db_url: str, api: TestClient) -> None:
    db = Database(db_url)
    run_id = add_run(db, "r-msg", RunStatus.RUNNING)
    with db.transaction() as s:
        run = s.get(Run, run_id)
        assert run is not None
        run.ray_message = "Traceback ... \x00\ud800 boom"
    with db.transaction() as s:
        stored = s.get(Run, run_id)
        assert stored is not None and stored.ray_message == "Traceback ... \ufffd\ufffd boom"
    db.dispose()
