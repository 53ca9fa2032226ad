"""The README's auth table holds for every route: with auth on, every call but /healthz, /readyz,
/metrics, /docs and /openapi.json needs a token (routes listed from the OpenAPI document, so a
new one is checked too); and every numeric query is bounded (422, never a 500)."""

from __future__ import annotations

import re
from typing import Any

import pytest
from fastapi.testclient import TestClient

from service.store.db import Database
from service.store.tokens import create as create_token
from tests.conftest import auth_on

PUBLIC = {("GET", "/healthz"), ("GET", "/readyz"), ("GET", "/metrics")}
# Outside the OpenAPI document: the browser's pages and their static files (no data; the page
# asks for a token and sends it as a bearer), and the API's own description.
PAGES = {"/", "/ui/", "/docs", "/docs/init.js", "/openapi.json"}


@pytest.fixture
def secured(db_url: str) -> Any:
    users = ("v", "vision", "viewer"), ("a", "vision", "admin")
    with auth_on(db_url, *users) as (client, [(_, viewer), (_, admin)]):
        yield client, {"Authorization": f"Bearer {viewer}"}, {"Authorization": f"Bearer {admin}"}


def operations(client: TestClient) -> list[tuple[str, str, dict[str, Any]]]:
    doc = client.get("/openapi.json").json()
    return [
        (method.upper(), path, op)
        for path, item in doc["paths"].items()
        for method, op in item.items()
        if method in {"get", "post", "put", "patch", "delete"}
    ]


def concrete(path: str) -> str:
    return re.sub(r"\{[^}]+\}", "x", path)


def test_every_route_but_the_public_ones_needs_a_token(secured: Any) -> None:
    client, *_ = secured
    ops = operations(client)
    assert len(ops) > 15
    for method, path, _op in ops:
        body = {} if method in {"POST", "PUT", "PATCH"} else None
        resp = client.request(method, concrete(path), json=body)
        if (method, path) in PUBLIC:
            assert resp.status_code != 401, (method, path)
        else:
            assert resp.status_code == 401, (method, path, resp.status_code)
            assert resp.headers["www-authenticate"] == "Bearer"


def test_the_pages_outside_the_api_description_are_public(secured: Any) -> None:
    client, *_ = secured
    described = {path for _, path, _ in operations(client)}
    for path in PAGES:
        assert path not in described
        assert client.get(path, follow_redirects=False).status_code in (200, 307), path


def test_recipes_and_verl_versions_answer_a_viewer(secured: Any) -> None:
    client, viewer, _ = secured
    for path in ("/recipes", "/verl/versions"):
        assert client.get(path).status_code == 401
        assert client.get(path, headers=viewer).status_code == 200


def test_every_numeric_query_is_bounded(secured: Any) -> None:
    client, _, admin = secured
    run_id = "run-x"  # unknown: a bounded value is a 404, an unbounded one must still be a 422
    checked = 0
    for method, path, op in operations(client):
        for param in op.get("parameters", []):
            schema = param.get("schema", {})
            types = {schema.get("type")} | {s.get("type") for s in schema.get("anyOf", [])}
            if param["in"] != "query" or "integer" not in types:
                continue
            for value in (2**63, 2**64, -(2**63) - 1):
                resp = client.request(
                    method,
                    path.replace("{run_id}", run_id).replace("{token_id}", "tok_x"),
                    params={param["name"]: value},
                    headers=admin,
                )
                assert resp.status_code == 422, (path, param["name"], value, resp.status_code)
                checked += 1
    assert checked >= 3 * 8


def test_a_huge_last_event_id_is_no_position_not_a_500(secured: Any, db_url: str) -> None:
    client, viewer, _ = secured
    db = Database(db_url)
    with db.transaction() as s:
        _, member = create_token(s, "m", "vision", "member")
    db.dispose()
    made = client.post(
        "/runs", json={"recipe": "test-script"}, headers={"Authorization": f"Bearer {member}"}
    )
    run_id = made.json()["id"]
    with client.stream(
        "GET",
        f"/runs/{run_id}/events",
        headers=viewer | {"Last-Event-ID": f"{2**64}-{2**63}"},
    ) as resp:
        assert resp.status_code == 200
        kinds = []
        for line in resp.iter_lines():
            if line.startswith("event: "):
                kinds.append(line.removeprefix("event: "))
                break
    assert kinds == ["status"]  # replayed from the start: the run's first status event
