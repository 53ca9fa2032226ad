"""The HTTP API on SQLite and on PostgreSQL: accept, read, list, idempotency, cancel, errors."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, event, text

from service.store.models import RunEvent

PROBLEM = "application/problem+json"


def post(api: TestClient, body: dict[str, Any] | None = None, **headers: str) -> Any:
    return api.post("/runs", json=body or {"recipe": "test-script"}, headers=headers)


def test_a_posted_run_is_queued_stored_before_the_answer_and_readable(
    api: TestClient, db_url: str
) -> None:
    resp = post(api, {"recipe": "test-script", "name": "first", "team": "vision", "seconds": 3})
    assert resp.status_code == 201, resp.text
    run = resp.json()
    assert resp.headers["location"] == f"/runs/{run['id']}"
    assert run["status"] == "QUEUED" and run["name"] == "first" and run["team"] == "vision"
    assert run["command"][0] == "python3" and run["command"][-4:-1] == ["first", "3.0", "0"]
    assert [e["to_status"] for e in run["events"]] == ["QUEUED"]
    # Durable: another connection sees the committed row as soon as the answer arrived.
    engine = create_engine(db_url)
    with engine.connect() as conn:
        stored = conn.execute(text("SELECT status FROM runs WHERE id = :i"), {"i": run["id"]})
        assert stored.scalar_one() == "QUEUED"
    engine.dispose()
    got = api.get(f"/runs/{run['id']}").json()
    assert got["id"] == run["id"] and got["spec"]["seconds"] == 3.0
    assert got["ray"] == {
        "submission_id": run["id"],
        "status": None,
        "message": None,
        "error_type": None,
        "exit_code": None,
    }


def test_unknown_run_is_a_404_problem(api: TestClient) -> None:
    resp = api.get("/runs/nope")
    assert resp.status_code == 404
    assert resp.headers["content-type"] == PROBLEM
    assert resp.json()["title"] == "Not found" and resp.json()["status"] == 404


def test_invalid_spec_is_a_422_problem_naming_the_field_and_stores_nothing(api: TestClient) -> None:
    post(api)
    resp = post(api, {"recipe": "test-script", "seconds": -1, "bogus": 1})
    assert resp.status_code == 422
    assert resp.headers["content-type"] == PROBLEM
    fields = {e["field"] for e in resp.json()["errors"]}
    assert fields == {"seconds", "bogus"}
    resp = post(api, {"recipe": "no-such-recipe"})
    assert resp.status_code == 422 and resp.json()["errors"][0]["field"] == "recipe"
    resp = api.post("/runs", content=b"[1, 2", headers={"content-type": "application/json"})
    assert resp.status_code == 422 and resp.headers["content-type"] == PROBLEM
    assert len(api.get("/runs").json()["items"]) == 1


def test_same_idempotency_key_and_body_returns_the_same_run(api: TestClient) -> None:
    body = {"recipe": "test-script", "name": "idem"}
    first = post(api, body, **{"Idempotency-Key": "k-1"})
    again = post(api, body, **{"Idempotency-Key": "k-1"})
    assert first.status_code == again.status_code == 201
    assert again.json()["id"] == first.json()["id"]
    assert again.headers["idempotent-replayed"] == "true"
    assert len(api.get("/runs").json()["items"]) == 1


def test_same_idempotency_key_with_another_body_is_a_409(api: TestClient) -> None:
    first = post(api, {"recipe": "test-script", "name": "a"}, **{"Idempotency-Key": "k-2"})
    other = post(api, {"recipe": "test-script", "name": "b"}, **{"Idempotency-Key": "k-2"})
    assert other.status_code == 409 and other.headers["content-type"] == PROBLEM
    assert other.json()["run_id"] == first.json()["id"]


def test_an_empty_idempotency_key_is_no_key(api: TestClient) -> None:
    runs = [post(api, {"recipe": "test-script"}, **{"Idempotency-Key": ""}) for _ in range(2)]
    assert [r.status_code for r in runs] == [201, 201]
    assert runs[0].json()["id"] != runs[1].json()["id"]
    assert "idempotent-replayed" not in runs[1].headers


def test_list_is_newest_first_filtered_and_paginated_by_cursor(api: TestClient) -> None:
    ids = [
        post(api, {"recipe": "test-script", "team": t}).json()["id"]
        for t in ["a", "b", "a", "a", "b"]
    ]
    api.post(f"/runs/{ids[0]}/cancel")
    page = api.get("/runs", params={"limit": 2}).json()
    assert [r["id"] for r in page["items"]] == ids[::-1][:2]
    seen = [r["id"] for r in page["items"]]
    while page["next_cursor"]:
        page = api.get("/runs", params={"limit": 2, "cursor": page["next_cursor"]}).json()
        seen += [r["id"] for r in page["items"]]
    assert seen == ids[::-1]
    team_a = api.get("/runs", params={"team": "a"}).json()["items"]
    assert [r["id"] for r in team_a] == [ids[3], ids[2], ids[0]]
    cancelled = api.get("/runs", params={"status": "CANCELLED"}).json()["items"]
    assert [r["id"] for r in cancelled] == [ids[0]]
    assert api.get("/runs", params={"status": "BOGUS"}).status_code == 422


def test_cancelling_a_queued_run_cancels_it_at_once_and_a_second_cancel_is_a_409(
    api: TestClient,
) -> None:
    run_id = post(api).json()["id"]
    resp = api.post(f"/runs/{run_id}/cancel")
    assert resp.status_code == 200 and resp.json()["status"] == "CANCELLED"
    assert [e["to_status"] for e in resp.json()["events"]] == ["QUEUED", "CANCELLED"]
    again = api.post(f"/runs/{run_id}/cancel")
    assert again.status_code == 409 and again.headers["content-type"] == PROBLEM


def test_dry_run_returns_the_plan_and_stores_nothing(api: TestClient) -> None:
    resp = api.post("/runs", params={"dry_run": True}, json={"recipe": "test-script", "npus": 4})
    assert resp.status_code == 200
    plan = resp.json()
    assert plan["dry_run"] is True and plan["shape"]["accelerators"] == 4
    assert plan["entrypoint_resources"] == {"NPU": 4.0}
    assert api.get("/runs").json()["items"] == []


def test_oversized_body_is_refused(api: TestClient) -> None:
    resp = post(api, {"recipe": "test-script", "message": "x" * 2_000_000})
    assert resp.status_code == 413


def test_health_and_readiness_report_database_and_ray_apart(api: TestClient) -> None:
    assert api.get("/healthz").json() == {"status": "ok"}
    ready = api.get("/readyz")
    assert ready.status_code == 200
    body = ready.json()
    assert body["checks"]["database"]["ok"] is True
    assert body["checks"]["ray"]["ok"] is False  # nothing listens on the configured address


def test_openapi_document_lists_the_contract(api: TestClient) -> None:
    paths = api.get("/openapi.json").json()["paths"]
    assert {"/runs", "/runs/{run_id}", "/runs/{run_id}/cancel", "/healthz", "/readyz"} <= set(paths)


def _queries(api: TestClient, path: str) -> int:
    """How many SQL statements answering ``path`` sends (the transaction's own not counted)."""
    engines = api.app.state.services.db.engines  # type: ignore[attr-defined]
    sent: list[str] = []

    def count(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        if not statement.startswith(("BEGIN", "SELECT 1", "COMMIT", "ROLLBACK")):
            sent.append(statement)

    for engine in engines:
        event.listen(engine, "before_cursor_execute", count)
    try:
        assert api.get(path).status_code == 200
    finally:
        for engine in engines:
            event.remove(engine, "before_cursor_execute", count)
    return len(sent)


def test_reads_send_as_many_queries_for_a_big_run_and_a_long_list_as_for_small_ones(
    api: TestClient,
) -> None:
    small = post(api).json()["id"]
    big = post(api).json()["id"]
    for _ in range(20):
        api.post(f"/runs/{post(api).json()['id']}/cancel")
    # The run, its events, its latest values: in one statement on PostgreSQL.
    one_run = 1 if api.app.state.services.db.engine.dialect.name == "postgresql" else 3  # type: ignore[attr-defined]
    assert _queries(api, f"/runs/{big}") == _queries(api, f"/runs/{small}") == one_run
    # The page, then the summary metrics (progress, reward) of all its runs at once.
    assert _queries(api, "/runs?limit=2") == _queries(api, "/runs?limit=100") == 2


def test_a_read_transaction_refuses_to_write(api: TestClient) -> None:
    db = api.app.state.services.db  # type: ignore[attr-defined]
    run_id = post(api).json()["id"]
    with pytest.raises(RuntimeError, match="must not write"), db.read() as session:
        session.add(RunEvent(run_id=run_id, to_status="QUEUED", reason="x"))
        session.flush()
