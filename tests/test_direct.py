"""``GET /runs/{id}`` is answered before routing, kept or read, exactly as the route answers it:
same body and headers, 304 for a held ETag, the request timed under the route's template, a run
that does not exist the route's problem; a caller the token cache cannot vouch for, or one who
may not see the run, goes to the route, which answers why.

``POST /runs`` likewise: the route's answer, problems and idempotency without the route; a dry
run, a body the route must judge or a caller below member goes to it; an unexpected failure is
one 500, the accept never tried again by the route."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.exc import OperationalError

from service.api import runs
from service.app import create_app
from service.operations import accept
from service.store import tokens
from service.store.db import Database
from tests.conftest import make_settings

SPEC = {"recipe": "test-script"}


@pytest.fixture
def served(db_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    """Auth on; members of "red" (two) and of "blue"; the reads that reach the route counted."""
    settings = make_settings(
        db_url, "http://127.0.0.1:9", run_loops=False, auth="on", read_cache_s=60
    )
    routed: list[str] = []
    sees = runs.ensure_sees

    def counted(principal: Any, team: str, run_id: str) -> None:
        routed.append(run_id)
        sees(principal, team, run_id)

    # What the route's body does once it has the answer (answered before routing: not called).
    monkeypatch.setattr(runs, "ensure_sees", counted)
    with TestClient(create_app(settings)) as client:
        db: Database = client.app.state.services.db  # type: ignore[attr-defined]
        auth = {}
        with db.transaction() as s:
            for name in ("red", "red-new", "blue"):
                team = name.split("-")[0]
                _row, secret = tokens.create(s, f"{name}-user", team, "member")
                auth[name] = {"Authorization": f"Bearer {secret}"}
        yield {"client": client, "auth": auth, "routed": routed}


def _same(a: Any, b: Any) -> None:
    assert a.status_code == b.status_code and a.content == b.content
    drop = {"date"}
    assert {k: v for k, v in a.headers.items() if k not in drop} == {
        k: v for k, v in b.headers.items() if k not in drop
    }


def test_the_answer_is_the_routes_own_kept_or_read_without_the_route(
    served: dict[str, Any],
) -> None:
    client, auth, routed = served["client"], served["auth"], served["routed"]
    red = auth["red"]  # signed in already (it submitted): the token cache vouches for it
    run_id = client.post("/runs", json=SPEC, headers=red).json()["id"]
    routed.clear()
    direct = client.get(f"/runs/{run_id}", headers=red)  # a miss, read before routing
    assert direct.status_code == 200 and not routed
    # A token not signed in yet goes to the route (which signs it in): the same answer.
    by_route = client.get(f"/runs/{run_id}", headers=auth["red-new"])
    assert routed == [run_id]
    _same(by_route, direct)
    _same(client.get(f"/runs/{run_id}", headers=auth["red-new"]), direct)  # kept, direct
    held = {**red, "If-None-Match": direct.headers["etag"]}
    not_modified = client.get(f"/runs/{run_id}", headers=held)
    assert not_modified.status_code == 304 and not_modified.content == b""
    assert not_modified.headers["etag"] == direct.headers["etag"]
    # A write to the run: the next read, still before routing, sees it.
    assert client.post(f"/runs/{run_id}/cancel", headers=red).status_code == 200
    assert client.get(f"/runs/{run_id}", headers=red).json()["status"] == "CANCELLED"
    assert routed == [run_id]
    # Timed under the route's template, as the route's own answers are.
    text = client.get("/metrics").text
    labels = 'method="GET",route="/runs/{run_id}",status="200"'
    assert f"rlrun_http_request_duration_seconds_count{{{labels}}} 4.0" in text


def test_callers_the_cache_cannot_vouch_for_go_to_the_route(served: dict[str, Any]) -> None:
    client, auth, routed = served["client"], served["auth"], served["routed"]
    run_id = client.post("/runs", json=SPEC, headers=auth["red"]).json()["id"]
    assert client.get(f"/runs/{run_id}", headers=auth["red"]).status_code == 200  # kept
    assert client.post("/runs", json=SPEC, headers=auth["blue"]).status_code == 201  # signed in
    # Another team: the route's 404, as if the run did not exist, its held ETag included.
    # (Red's read is the cache's while its sign-in is kept, the route's after: count after it.)
    etag = client.get(f"/runs/{run_id}", headers=auth["red"]).headers["etag"]
    routed.clear()
    for headers in (auth["blue"], {**auth["blue"], "If-None-Match": etag}):
        refused = client.get(f"/runs/{run_id}", headers=headers)
        assert refused.status_code == 404
        assert refused.headers["content-type"] == "application/problem+json"
    # No token, an unknown one, another scheme: the route's 401.
    for headers in ({}, {"Authorization": "Bearer rlrun_nope"}, {"Authorization": "Basic x"}):
        assert client.get(f"/runs/{run_id}", headers=headers).status_code == 401
    # An If-None-Match longer than the route allows: the route's 422.
    too_long = {**auth["red"], "If-None-Match": "x" * 1001}
    assert client.get(f"/runs/{run_id}", headers=too_long).status_code == 422
    # Blue's two reached the route's body; the 401s and the 422 stopped in its dependencies.
    assert routed == [run_id] * 2
    # A run that does not exist: answered here with the route's problem, read once, and shaped
    # as the other team's 404 (which says no more than that).
    missing = client.get("/runs/run_nope", headers=auth["red"])
    assert missing.status_code == 404 and routed == [run_id] * 2
    assert missing.headers["content-type"] == "application/problem+json"
    assert missing.json() == {
        **refused.json(),
        "detail": "no run 'run_nope'",
        "instance": "/runs/run_nope",
    }


@pytest.fixture
def accepting(served: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """``served``, with the accepts that reach the route counted (its validation slot)."""
    client: TestClient = served["client"]
    app: Any = client.app
    reached: list[str] = []

    async def counted_slot() -> AsyncIterator[None]:
        reached.append("route")
        yield

    app.dependency_overrides[runs.validation_slot] = counted_slot
    yield served | {"reached": reached}
    app.dependency_overrides.clear()


def _accepted_alike(a: Any, b: Any) -> None:
    """Two accepts of the same spec: the same answer but for the run's own id and times."""
    assert a.status_code == b.status_code == 201
    own = {"date", "location", "content-length"}
    assert {k: v for k, v in a.headers.items() if k not in own} == {
        k: v for k, v in b.headers.items() if k not in own
    }
    assert a.headers["location"] == f"/runs/{a.json()['id']}"

    def stable(doc: dict[str, Any]) -> dict[str, Any]:
        run_id = doc["id"]
        text = json.dumps(doc).replace(run_id, "RUN").replace(run_id[-8:], "TAIL")
        same = {k: v for k, v in json.loads(text).items() if not k.endswith("_at")}
        return same | {
            "events": [{k: e[k] for k in e if k not in {"id", "at"}} for e in same["events"]]
        }

    assert stable(a.json()) == stable(b.json())


def test_an_accept_is_the_routes_own_answer_without_the_route(
    accepting: dict[str, Any],
) -> None:
    client, auth, reached = accepting["client"], accepting["auth"], accepting["reached"]
    red = auth["red"]
    direct = client.post("/runs", json=SPEC, headers=red)
    assert direct.status_code == 201 and reached == []
    # A query sends it to the route: the same answer, stored the same way.
    by_route = client.post("/runs?dry_run=false", json=SPEC, headers=red)
    assert reached == ["route"]
    _accepted_alike(direct, by_route)
    for answer in (direct, by_route):
        stored = client.get(answer.headers["location"], headers=red).json()
        assert stored["status"] == "QUEUED" and stored["team"] == "red"
    # A refused spec: the route's problem, word for word.
    bad = {"recipe": "test-script", "seconds": -1, "team": "red"}
    refused = client.post("/runs", json=bad, headers=red)
    assert refused.status_code == 422 and reached == ["route"]
    assert refused.headers["content-type"] == "application/problem+json"
    _same(refused, client.post("/runs?dry_run=false", json=bad, headers=red))
    # Another team's spec from a member: the route's 403.
    other = client.post("/runs", json={**SPEC, "team": "blue"}, headers=red)
    assert other.status_code == 403 and reached == ["route"] * 2
    _same(other, client.post("/runs?dry_run=false", json={**SPEC, "team": "blue"}, headers=red))
    # Idempotency: a replay is the same run, another body under the key the route's 409.
    keyed = {**red, "Idempotency-Key": "k-1"}
    first = client.post("/runs", json=SPEC, headers=keyed)
    again = client.post("/runs", json=SPEC, headers=keyed)
    assert again.headers["idempotent-replayed"] == "true"
    assert again.json()["id"] == first.json()["id"]
    conflict = client.post("/runs", json={**SPEC, "name": "other"}, headers=keyed)
    assert conflict.status_code == 409 and reached == ["route"] * 3
    # Timed under the route's template, as the route's own answers are (three here, one there).
    text = client.get("/metrics").text
    labels = 'method="POST",route="/runs",status="201"'
    assert f"rlrun_http_request_duration_seconds_count{{{labels}}} 4.0" in text


def test_what_the_route_must_judge_goes_to_it_with_its_body(accepting: dict[str, Any]) -> None:
    client, auth, reached = accepting["client"], accepting["auth"], accepting["reached"]
    red = auth["red"]
    body = json.dumps(SPEC)
    json_type = {"Content-Type": "application/json"}
    assert client.post("/runs?dry_run=true", content=body, headers={**red, **json_type}).json()[
        "dry_run"
    ]
    assert reached == ["route"]
    # A body of another content type or none, or that is no JSON object, an overlong key: the
    # route's refusal, word for word (a query sends the same request to the route).
    cases: list[tuple[dict[str, str], str]] = [
        ({"Content-Type": "text/plain"}, body),
        ({}, body),
        (json_type, "[1]"),
        (json_type, "{nope"),
        ({**json_type, "Idempotency-Key": "k" * 201}, body),
    ]
    for headers, content in cases:
        answer = client.post("/runs", content=content, headers={**red, **headers})
        assert answer.status_code == 422, (headers, content)
        _same(answer, client.post("/runs?q=1", content=content, headers={**red, **headers}))
    # A viewer is the route's 403; no token the door's 401.
    with client.app.state.services.db.transaction() as s:  # type: ignore[attr-defined]
        _row, secret = tokens.create(s, "watcher", "red", "viewer")
    viewer = {"Authorization": f"Bearer {secret}"}
    assert client.post("/runs", json=SPEC, headers=viewer).status_code == 403
    assert client.post("/runs", json=SPEC).status_code == 401


def test_an_accept_that_fails_unexpectedly_is_one_500_never_tried_again(
    accepting: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    client, auth, reached = accepting["client"], accepting["auth"], accepting["reached"]
    tries: list[object] = []

    def broken(*args: object) -> None:
        tries.append(args)
        raise RuntimeError("after the commit, say")

    monkeypatch.setattr(accept, "accept_run", broken)
    answer = TestClient(client.app, raise_server_exceptions=False).post(
        "/runs", json=SPEC, headers=auth["red"]
    )
    assert answer.status_code == 500 and len(tries) == 1 and reached == []
    assert answer.headers["content-type"] == "application/problem+json"
    assert "error id" in answer.json()["detail"]
    # A database that went away is the app's own 503 to retry, as the route would answer it.

    def away(*_args: object) -> None:
        raise OperationalError("INSERT INTO runs ...", {}, Exception("connection refused"))

    monkeypatch.setattr(accept, "accept_run", away)
    answer = client.post("/runs", json=SPEC, headers=auth["red"])
    assert answer.status_code == 503 and reached == []
    assert answer.json()["detail"] == "the database cannot be reached; retry shortly"
