"""What the audit trail records at the door: failed sign-ins (at most one row per network per
minute, with a count, and a cap on rows a minute in all whatever addresses they come from), tokens
made and revoked with the CLI, and the client address from proxy headers only when the peer is a
proxy the operator names."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from service import cli
from service.api import sign_in_audit
from service.store import audit
from service.store.db import Database, upgrade
from tests.conftest import auth_on, cli_on, served
from tests.factories import sqlite_with_tokens
from tests.live import status_from
from tests.service_process import ServiceProcess


def rows(db_url: str, action: str | None = None) -> list[Any]:
    db = Database(db_url)
    with db.read() as s:
        found = [r for r in audit.page(s, 500) if action is None or r.action == action]
        out = [(r.action, r.user, r.role, r.client, r.target) for r in found]
    db.dispose()
    return out


@pytest.fixture
def secured(db_url: str) -> Any:
    users = ("gone", "vision", "member"), ("ops", "vision", "admin")
    with auth_on(db_url, *users) as (client, [(row, secret), (_, admin)]):
        yield client, {"revoked": secret, "revoked_id": row.id, "admin": admin}


def test_failed_sign_ins_are_audited_once_a_minute_per_network(secured: Any, db_url: str) -> None:
    client, tokens = secured
    auth = {"Authorization": f"Bearer {tokens['admin']}"}
    assert client.delete(f"/tokens/{tokens['revoked_id']}", headers=auth).status_code == 200
    bad = [
        "rlrun_unknown",
        tokens["revoked"],
        "eyJhbGciOiJub25lIn0.eyJzdWIiOiJ4In0.",  # a JWT (no OIDC here: an unknown token)
    ]
    for token in bad * 5:
        resp = client.get("/runs", headers={"Authorization": f"Bearer {token}"})
        assert resp.status_code == 401
    # A request with a body is refused at the door, and counted the same.
    assert client.post("/runs", json={}, headers={"Authorization": "Bearer x"}).status_code == 401
    failed = rows(db_url, "auth.failed")
    assert len(failed) == 1, failed  # 16 failures, one row this minute
    _, user, role, address, target = failed[0]
    assert (user, role) == ("unknown", "none") and address.startswith("testclient")
    assert target.startswith("failures=1;") and "unknown or revoked" in target
    # No credential at all is not a failed sign-in.
    assert client.get("/runs").status_code == 401
    assert len(rows(db_url, "auth.failed")) == 1


def test_the_next_rows_count_carries_the_failures_in_between(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    upgrade(db_url)
    db = Database(db_url)
    clock = [1000.0]
    monkeypatch.setattr(sign_in_audit.time, "monotonic", lambda: clock[0])
    failures = sign_in_audit.FailedSignIns(window_s=60)

    def fail(client: str, reason: str) -> None:  # as auth.resolve does
        if due := failures.failed(client):
            failures.write(db, client, reason, due)

    for i in range(7):
        fail(f"10.0.0.{i + 1}:5000", "bad")  # one /24: one network
    fail("10.0.1.2:5000", "bad")  # another network: its own row
    fail("[2001:db8::1]:5000", "v6")
    fail("[2001:db8::ffff:1]:5000", "v6")  # the same /64
    clock[0] += 61
    fail("10.0.0.200:5001", "worse")
    db.dispose()
    targets = sorted((r[3], r[4]) for r in rows(db_url, "auth.failed"))
    assert targets == [
        ("10.0.0.1:5000", "failures=1; last: bad"),
        ("10.0.0.200:5001", "failures=7; last: worse"),  # the 6 held back, and this one
        ("10.0.1.2:5000", "failures=1; last: bad"),
        ("[2001:db8::1]:5000", "failures=1; last: v6"),
    ]


def test_a_network_is_a_slash_24_or_a_slash_64() -> None:
    assert sign_in_audit.network("127.4.5.6:80") == "127.4.5.0/24"
    assert sign_in_audit.network("[::ffff:127.4.5.6]:80") == "127.4.5.0/24"
    assert sign_in_audit.network("[2001:db8:1:2:3::9]:80") == "2001:db8:1:2::/64"
    assert sign_in_audit.network("testclient:50000") == "testclient"


def test_failed_sign_ins_past_the_cap_are_one_row_of_how_many_more(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    upgrade(db_url)
    db = Database(db_url)
    clock = [1000.0]
    monkeypatch.setattr(sign_in_audit.time, "monotonic", lambda: clock[0])
    failures = sign_in_audit.FailedSignIns(window_s=60, rows_per_window=5)
    for i in range(100):  # 100 networks in one minute
        client = f"10.{i}.0.1:5000"
        if due := failures.failed(client):
            failures.write(db, client, "bad", due)
    assert len(rows(db_url, "auth.failed")) == 5
    clock[0] += 61
    failures.write(db, "10.0.0.1:1", "bad", failures.failed("10.0.0.1:1"))
    db.dispose()
    targets = [r[4] for r in rows(db_url, "auth.failed")]
    assert len(targets) == 7
    assert "failures=95 more, from 95 networks, past the cap of 5 rows a minute" in targets


def test_bad_tokens_from_many_loopback_networks_are_capped(tmp_path: Any) -> None:
    # Code on the host (a job included) picks any source address of 127/8: 400 bad tokens from
    # 400 networks write the cap's rows, not 400 (SQLite only: the folding is in memory).
    db_url, _ = sqlite_with_tokens(tmp_path, "door.sqlite")
    with served(db_url, auth="on") as url:
        for i in range(400):
            address = f"127.{1 + i // 200}.{i % 200}.9"
            assert status_from(address, url, "GET", "/runs", f"bad{i}") == 401
    failed = rows(db_url, "auth.failed")
    assert len(failed) == sign_in_audit.ROWS_PER_WINDOW, len(failed)
    assert {r[3].rsplit(":", 1)[0] for r in failed} <= {
        f"127.{1 + i // 200}.{i % 200}.9" for i in range(400)
    }


def test_tokens_made_and_revoked_with_the_cli_are_audited(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    runner = cli_on(db_url, monkeypatch)
    made = runner.invoke(cli.app, ["token", "create", "--user", "ops", "--team", "vision"])
    assert made.exit_code == 0, made.output
    token_id = made.output.split()[0]
    assert runner.invoke(cli.app, ["token", "revoke", token_id]).exit_code == 0
    logged = rows(db_url)
    assert [r[0] for r in logged] == ["token.revoke", "token.create"]
    assert all(r[1].startswith("cli:") and r[3].startswith("cli@") for r in logged)
    assert logged[1][4] == f"{token_id} member@vision"


@pytest.mark.parametrize("trusted", [False, True])
def test_the_client_address_comes_from_proxy_headers_only_from_a_named_proxy(
    tmp_path: Any, trusted: bool
) -> None:
    url, (admin,) = sqlite_with_tokens(tmp_path, "db.sqlite", ("ops", "vision", "admin"))
    service = ServiceProcess(url, "http://127.0.0.1:9", tmp_path / "service.log")
    service.env |= {"RLRUN_AUTH": "on", "RLRUN_RUN_LOOPS": "false"}
    if trusted:
        service.env["RLRUN_FORWARDED_ALLOW_IPS"] = "127.0.0.1"
    service.start()
    try:
        headers = {"Authorization": f"Bearer {admin}", "X-Forwarded-For": "203.0.113.7"}
        made = httpx.post(
            f"{service.url}/tokens", json={"user": "u", "team": "vision"}, headers=headers
        )
        assert made.status_code == 201, made.text
    finally:
        service.stop()
    [(_, _, _, address, _)] = rows(url, "token.create")
    host = address.rsplit(":", 1)[0]
    assert host == ("203.0.113.7" if trusted else "127.0.0.1")
