"""The service against its own OpenAPI document (schemathesis): with auth on, with no token and
with an admin's, no answer is a 500, every answer matches its documented schema and status.

The cases are the same on every run (``derandomize``: Hypothesis' seed comes from the test
itself, and no example database carries cases from one run to the next), so a red run is a
regression anyone reproduces by running it again. Before them, every request a campaign found a
5xx with (``tests/data/fuzz_examples.json``, written by ``tests/benchmarks/fuzz_api.py``) is
asked again. The long random campaign is that script."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from fastapi import FastAPI
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from schemathesis import checks

from service.app import create_app
from service.store.db import Database, upgrade
from service.store.tokens import create as create_token
from tests.conftest import _truncate as truncate
from tests.conftest import make_settings

TOKEN: dict[str, str] = {}
# No 500, every status documented, every answer in its documented media type and schema. (Not
# "schema-valid data is accepted": a run spec valid by JSON schema may still break a verl rule.)
CHECKS = [
    checks.not_a_server_error,
    checks.status_code_conformance,
    checks.content_type_conformance,
    checks.response_schema_conformance,
    checks.response_headers_conformance,
]


@pytest.fixture(
    scope="module", params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
def secured_app(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[FastAPI]:
    if request.param == "sqlite":
        url = f"sqlite:///{Path(tmp_path_factory.mktemp('schema')) / 'rlrun.db'}"
    else:
        url = request.getfixturevalue("pg_database")
        truncate(url)
    upgrade(url)
    db = Database(url)
    with db.transaction() as s:
        TOKEN["admin"] = create_token(s, "fuzz", "vision", "admin")[1]
    db.dispose()
    app = create_app(make_settings(url, "http://127.0.0.1:9", run_loops=False, auth="on"))
    with TestClient(app):
        yield app


def fuzz(app: FastAPI, headers: dict[str, str]) -> list[str]:
    """Each operation with a bounded number of generated requests; the operations tried."""
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    tried = []
    for result in schema.get_all_operations():
        operation = result.ok()
        tried.append(operation.label)

        @given(case=operation.as_strategy())
        @settings(
            max_examples=25,
            deadline=None,
            derandomize=True,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        def check(case: Any) -> None:
            case.call_and_validate(headers=headers, checks=CHECKS)

        check()
    return tried


EXAMPLES = json.loads((Path(__file__).parent / "data" / "fuzz_examples.json").read_text())


@pytest.mark.slow
@pytest.mark.parametrize("who", ["anonymous", "admin"])
def test_every_request_that_once_got_a_5xx_gets_none(secured_app: FastAPI, who: str) -> None:
    headers = {"Authorization": f"Bearer {TOKEN['admin']}"} if who == "admin" else {}
    with TestClient(secured_app, raise_server_exceptions=False) as client:
        for example in EXAMPLES:
            asked = example["request"]
            answer = client.request(
                asked["method"],
                asked["path"],
                params=asked["query"],
                headers=asked["headers"] | headers,
                json=asked["body"],
            )
            assert answer.status_code < 500, (example["found"], answer.text)


@pytest.mark.slow
@pytest.mark.parametrize("who", ["anonymous", "admin"])
def test_answers_match_the_openapi_document(secured_app: FastAPI, who: str) -> None:
    headers = {"Authorization": f"Bearer {TOKEN['admin']}"} if who == "admin" else {}
    tried = fuzz(secured_app, headers)
    assert {"POST /runs", "GET /runs/{run_id}", "DELETE /tokens/{token_id}"} <= set(tried)
