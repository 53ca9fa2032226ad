"""Identity and roles with auth on: the role x operation matrix, team from the token, revocation,
the audit trail, per-team rate limits, idempotency keys per caller, and the auth mode setting."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import anyio.to_thread
import httpx
import pytest
from fastapi.testclient import TestClient

from service.api.auth import ANONYMOUS
from service.api.limits import StreamSlots
from service.app import create_app
from service.cli import app as cli
from service.errors import TooManyRequests
from service.settings import Settings
from service.store.db import Database, upgrade
from service.store.tokens import create as create_token
from tests.conftest import cli_on, make_settings, wait_for
from tests.live import ServerThread

TEAM, OTHER = "vision", "speech"


class Caller:
    """A client that sends one token (or none) with every request."""

    def __init__(self, client: TestClient, token: str | None) -> None:
        self.client = client
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}

    def __getattr__(self, method: str) -> Any:
        def call(url: str, **kw: Any) -> Any:
            headers = {**self.headers, **kw.pop("headers", {})}
            return self.client.request(method.upper(), url, headers=headers, **kw)

        return call


@pytest.fixture
def secured(db_url: str) -> Iterator[dict[str, Any]]:
    """An app with auth on and a token per role in TEAM, plus a member and an admin of OTHER."""
    settings = make_settings(
        db_url, "http://127.0.0.1:9", run_loops=False, auth="on", runs_per_team_per_minute=5
    )
    db = Database(db_url)
    with TestClient(create_app(settings)) as client:
        made = {}
        with db.transaction() as s:
            for name, team, role in [
                ("viewer", TEAM, "viewer"),
                ("member", TEAM, "member"),
                ("admin", OTHER, "admin"),
                ("other", OTHER, "member"),
            ]:
                row, secret = create_token(s, f"{name}-user", team, role)  # type: ignore[arg-type]
                made[name] = (row.id, secret)
        callers = {name: Caller(client, secret) for name, (_, secret) in made.items()}
        callers["anonymous"] = Caller(client, None)
        yield {"callers": callers, "ids": {n: i for n, (i, _) in made.items()}, "db": db}
    db.dispose()


def submit(caller: Caller, **body: Any) -> Any:
    return caller.post("/runs", json={"recipe": "test-script", **body})


ROLE_MATRIX = """
anonymous get  /runs                   401
anonymous get  /runs/{own}             401
anonymous post /runs/{own}/cancel      401
anonymous get  /cluster                401
anonymous get  /healthz                200
viewer    get  /runs                   200
viewer    get  /runs/{own}             200
viewer    get  /runs/{own}/script      200
viewer    get  /runs/{own}/metrics     200
viewer    get  /runs/{own}/logs        200
viewer    get  /runs/{other}           404
viewer    get  /runs/{other}/logs      404
viewer    post /runs/{own}/cancel      403
viewer    get  /tokens                 403
member    get  /runs/{other}           404
member    get  /runs/{other}/script    404
member    get  /runs/{other}/metrics   404
member    get  /runs/{other}/events    404
member    post /runs/{other}/cancel    404
member    get  /tokens                 403
member    get  /audit                  403
admin     get  /runs/{other}           200
other     get  /runs/{own}             404
member    post /runs/{own}/cancel      200
admin     get  /runs/{own}             200
admin     get  /tokens                 200
admin     get  /audit                  200
admin     post /runs/{other}/cancel    200
"""


def check_role_matrix(callers: dict[str, Caller], own: str, other: str) -> None:
    """What each role may do: ``own`` is a run of TEAM's member, ``other`` one of OTHER's member
    (``other``); the viewer and the member are of TEAM, the admin of either team."""
    # who, method, path, status; the cancels last: they end the runs
    expected = [
        (who, method, path.format(own=own, other=other), int(status))
        for who, method, path, status in map(str.split, ROLE_MATRIX.strip().splitlines())
    ]
    got = [
        (who, method, path, getattr(callers[who], method)(path).status_code)
        for who, method, path, _ in expected
    ]
    assert got == expected


def test_role_by_operation_matrix(secured: dict[str, Any]) -> None:
    c = secured["callers"]
    own = submit(c["member"]).json()["id"]
    other = submit(c["other"]).json()["id"]
    check_role_matrix(c, own, other)
    assert submit(c["viewer"]).status_code == 403
    unauthorized = c["anonymous"].get("/runs")
    assert unauthorized.headers["www-authenticate"] == "Bearer"
    assert unauthorized.headers["content-type"] == "application/problem+json"
    assert c["anonymous"].get("/runs", headers={"Authorization": "Bearer nope"}).status_code == 401


def test_team_comes_from_the_token_and_only_an_admin_names_another(
    secured: dict[str, Any],
) -> None:
    c = secured["callers"]
    assert submit(c["member"]).json()["team"] == TEAM
    assert submit(c["member"], team=TEAM).status_code == 201
    refused = submit(c["member"], team=OTHER)
    assert refused.status_code == 403 and refused.json()["title"] == "Forbidden"
    assert submit(c["admin"], team=TEAM).json()["team"] == TEAM
    assert submit(c["admin"]).json()["team"] == OTHER
    # Lists: a non-admin sees its own team whatever it asks for; an admin sees all.
    mine = c["member"].get("/runs", params={"team": OTHER}).json()["items"]
    assert {r["team"] for r in mine} == {TEAM}
    assert {r["team"] for r in c["admin"].get("/runs").json()["items"]} == {TEAM, OTHER}


def test_priority_high_is_an_admins_or_a_granted_teams(
    secured: dict[str, Any], db_url: str
) -> None:
    c = secured["callers"]
    assert submit(c["member"], priority="high").status_code == 403
    assert submit(c["admin"], priority="high", team=TEAM).status_code == 201
    granted = make_settings(
        db_url, "http://127.0.0.1:9", run_loops=False, auth="on", high_priority_teams=[TEAM]
    )
    with TestClient(create_app(granted)) as client:
        member = Caller(client, c["member"].headers["Authorization"].split()[1])
        assert submit(member, priority="high").status_code == 201


def test_another_teams_runs_are_nameless_in_the_cluster_view(secured: dict[str, Any]) -> None:
    c = secured["callers"]
    submit(c["member"], name="ours")
    submit(c["other"], name="theirs")
    queue = c["member"].get("/cluster").json()["queue"]
    assert sorted((q["team"], q["name"]) for q in queue) == [(OTHER, None), (TEAM, "ours")]
    assert {q["name"] for q in c["admin"].get("/cluster").json()["queue"]} == {"ours", "theirs"}


def test_tokens_made_by_an_admin_work_at_once_and_revocation_is_immediate(
    secured: dict[str, Any],
) -> None:
    c = secured["callers"]
    made = c["admin"].post("/tokens", json={"user": "new", "team": TEAM, "role": "viewer"})
    assert made.status_code == 201
    token = made.json()["token"]
    fresh = Caller(c["admin"].client, token)
    assert fresh.get("/runs").status_code == 200
    listed = c["admin"].get("/tokens").json()["items"]
    assert made.json()["id"] in {t["id"] for t in listed}
    assert all("token" not in t and "token_hash" not in t for t in listed)
    assert c["admin"].delete(f"/tokens/{made.json()['id']}").status_code == 200
    assert fresh.get("/runs").status_code == 401
    assert c["member"].post("/tokens", json={"user": "x", "team": TEAM}).status_code == 403


def test_every_mutation_leaves_an_audit_row(secured: dict[str, Any]) -> None:
    c = secured["callers"]
    run_id = submit(c["member"]).json()["id"]
    c["member"].post(f"/runs/{run_id}/cancel")
    made = c["admin"].post("/tokens", json={"user": "u", "team": TEAM}).json()
    c["admin"].delete(f"/tokens/{made['id']}")
    submit(c["viewer"])  # refused: changes nothing, records nothing
    rows = c["admin"].get("/audit").json()["items"]
    assert [(r["action"], r["user"], r["run_id"]) for r in rows] == [
        ("token.revoke", "admin-user", None),
        ("token.create", "admin-user", None),
        ("run.cancel", "member-user", run_id),
        ("run.create", "member-user", run_id),
    ]
    assert all(r["client"] and r["at"] for r in rows)
    assert rows[2]["token_id"] == secured["ids"]["member"]
    page = c["admin"].get("/audit", params={"limit": 3}).json()
    rest = c["admin"].get("/audit", params={"limit": 3, "cursor": page["next_cursor"]}).json()
    assert [r["id"] for r in page["items"] + rest["items"]] == [r["id"] for r in rows]


def test_runs_per_team_per_minute_answer_429_with_retry_after(secured: dict[str, Any]) -> None:
    c = secured["callers"]
    assert all(submit(c["member"]).status_code == 201 for _ in range(5))
    refused = submit(c["member"])
    assert refused.status_code == 429
    assert 1 <= int(refused.headers["retry-after"]) <= 60
    assert submit(c["other"]).status_code == 201  # another team has its own budget


def test_idempotency_keys_belong_to_their_caller(secured: dict[str, Any]) -> None:
    c = secured["callers"]
    key = {"Idempotency-Key": "same"}
    mine = c["member"].post("/runs", json={"recipe": "test-script"}, headers=key).json()
    theirs = c["other"].post("/runs", json={"recipe": "test-script"}, headers=key)
    assert theirs.status_code == 201 and theirs.json()["id"] != mine["id"]
    again = c["member"].post("/runs", json={"recipe": "test-script"}, headers=key)
    assert again.json()["id"] == mine["id"]


def test_cli_bootstraps_lists_and_revokes_tokens(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    runner = cli_on(db_url, monkeypatch)
    args = ["token", "create", "--user", "ops", "--team", TEAM, "--role", "admin"]
    made = runner.invoke(cli, args)
    assert made.exit_code == 0, made.output
    token_id, secret = made.output.split()[0], made.output.strip().splitlines()[-1]
    assert secret.startswith("rlrun_") and len(secret) > 40
    listed = runner.invoke(cli, ["token", "list"])
    assert token_id in listed.output and secret not in listed.output
    settings = make_settings(db_url, "http://127.0.0.1:9", run_loops=False, auth="on")
    with TestClient(create_app(settings)) as client:
        admin = Caller(client, secret)
        assert admin.get("/tokens").status_code == 200
        assert runner.invoke(cli, ["token", "revoke", token_id]).exit_code == 0
        assert admin.get("/tokens").status_code == 401
    assert runner.invoke(cli, ["token", "create", "--user", "x", "--team", "Bad!"]).exit_code == 2


@pytest.mark.parametrize(
    ("mode", "host", "enabled"),
    [
        ("auto", "127.0.0.1", False),
        ("auto", "::1", False),
        ("auto", "localhost", False),
        ("auto", "0.0.0.0", True),
        ("auto", "10.1.2.3", True),
        ("on", "127.0.0.1", True),
        ("off", "0.0.0.0", False),
    ],
)
def test_auth_is_on_whenever_the_service_listens_beyond_loopback(
    mode: str, host: str, enabled: bool
) -> None:
    assert Settings(auth=mode, listen_host=host).auth_enabled is enabled  # type: ignore[arg-type]


def test_open_mode_says_so_at_start(db_url: str, caplog: pytest.LogCaptureFixture) -> None:
    settings = make_settings(db_url, "http://127.0.0.1:9", run_loops=False)
    with caplog.at_level("WARNING"), TestClient(create_app(settings)) as client:
        assert client.get("/runs").status_code == 200
    assert any("authentication is OFF" in r.getMessage() for r in caplog.records)


def test_stream_slots_refuse_one_over_the_limit_and_free_on_close() -> None:
    slots = StreamSlots()
    slots.take(ANONYMOUS.key, 2)
    slots.take(ANONYMOUS.key, 2)
    with pytest.raises(TooManyRequests):
        slots.take(ANONYMOUS.key, 2)
    slots.take("another", 2)
    slots.give(ANONYMOUS.key)
    slots.take(ANONYMOUS.key, 2)


def test_live_streams_per_token_are_limited_and_freed_when_closed(tmp_path: Any) -> None:
    url = f"sqlite:///{tmp_path}/db.sqlite"
    upgrade(url)
    db = Database(url)
    with db.transaction() as s:
        _, token = create_token(s, "watcher", TEAM, "member")
    db.dispose()
    settings = make_settings(
        url, "http://127.0.0.1:9", run_loops=False, auth="on", streams_per_caller=1
    )
    auth = {"Authorization": f"Bearer {token}"}
    with ServerThread(create_app(settings)) as server:
        made = httpx.post(f"{server}/runs", json={"recipe": "test-script"}, headers=auth)
        run_id = made.json()["id"]
        events = f"{server}/runs/{run_id}/events"
        timeout = httpx.Timeout(10)
        with httpx.stream("GET", events, headers=auth, timeout=timeout) as first:
            assert first.status_code == 200
            second = httpx.get(events, headers=auth, timeout=timeout)
            assert second.status_code == 429 and "retry-after" in second.headers

        def reopened() -> int:
            with httpx.stream("GET", events, headers=auth, timeout=timeout) as again:
                return again.status_code

        wait_for(reopened, lambda status: status == 200, timeout=20, every=0.5)


def test_an_answer_kept_for_one_caller_is_refused_to_another_team(
    secured: dict[str, Any],
) -> None:
    c = secured["callers"]
    other = submit(c["other"]).json()["id"]
    # The admin's read is kept (GET /runs/{id} answers repeat reads from memory) ...
    assert c["admin"].get(f"/runs/{other}").status_code == 200
    assert c["other"].get(f"/runs/{other}").status_code == 200
    # ... and is still another team's run to everyone else, its ETag included.
    etag = c["admin"].get(f"/runs/{other}").headers["etag"]
    held = {"If-None-Match": etag}
    assert c["member"].get(f"/runs/{other}", headers=held).status_code == 404
    assert c["other"].get(f"/runs/{other}", headers=held).status_code == 304
    assert c["member"].get(f"/runs/{other}").status_code == 404
    assert c["viewer"].get(f"/runs/{other}").status_code == 404
    assert c["anonymous"].get(f"/runs/{other}").status_code == 401


def test_a_kept_page_of_runs_is_only_ever_its_teams(secured: dict[str, Any]) -> None:
    c = secured["callers"]
    own, other = submit(c["member"]).json()["id"], submit(c["other"]).json()["id"]

    def listed(who: str) -> set[str]:
        return {r["id"] for r in c[who].get("/runs").json()["items"]}

    assert listed("admin") == {own, other}  # kept for the admin's view of every team
    assert listed("viewer") == listed("member") == {own}
    assert listed("other") == {other}


def test_a_token_is_checked_and_a_run_read_while_every_request_thread_is_busy(
    db_url: str,
) -> None:
    settings = make_settings(
        db_url, "http://127.0.0.1:9", run_loops=False, auth="on", request_threads=1
    )
    db = Database(db_url)
    with TestClient(create_app(settings)) as client:
        with db.transaction() as s:
            _row, secret = create_token(s, "reader", TEAM, "member")
        caller = Caller(client, secret)
        run_id = submit(caller).json()["id"]
        assert client.portal is not None
        release = threading.Event()
        # The one request thread waits (as for a slow database) until the reads are done.
        busy = client.portal.start_task_soon(anyio.to_thread.run_sync, release.wait, 30)
        try:
            started = time.monotonic()
            answers = [caller.get(f"/runs/{run_id}") for _ in range(3)]
            took = time.monotonic() - started
        finally:
            release.set()
            busy.result(timeout=30)
        # A refused token is recorded (a write) on a worker thread, which is free again.
        wrong = Caller(client, "rlrun_not-a-token").get(f"/runs/{run_id}")
    db.dispose()
    assert [a.status_code for a in answers] == [200] * 3
    assert answers[0].json()["id"] == run_id
    assert took < 20  # never the 30 s of the busy thread
    assert wrong.status_code == 401
