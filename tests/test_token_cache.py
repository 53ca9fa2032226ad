"""API tokens that signed in are trusted for ``signin_cache_s`` without a read, and forgotten
the moment they are revoked where the revocation is told: this replica's commit, another
replica's through the change feed (PostgreSQL); elsewhere (another process on SQLite) within
the bound, which ``rlrun token revoke`` waits out."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import ExitStack
from typing import Any

import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from service.api.token_cache import TokenCache
from service.app import create_app
from service.cli import app as cli
from service.principal import Principal
from service.store import tokens
from service.store.changes import Changes
from service.store.db import Database, upgrade
from tests.conftest import _truncate as truncate
from tests.conftest import make_settings
from tests.factories import statements

TTL_S = 30.0  # far longer than any step below: only a revocation told can explain a 401


def _principal(token_id: str) -> Principal:
    return Principal(user="u", team="t", role="viewer", token_id=token_id)


def test_a_token_is_kept_for_its_bound_and_forgotten_when_revoked() -> None:
    cache = TokenCache(ttl_s=0.2)
    cache.keep("d1", _principal("tok_1"), cache.ticket())
    cache.keep("d2", _principal("tok_2"), cache.ticket())
    assert cache.get("d1") == _principal("tok_1") and cache.get("d3") is None
    cache.changed(Changes(runs={}, tokens={"tok_1"}))
    assert cache.get("d1") is None and cache.get("d2") is not None
    time.sleep(0.25)
    assert cache.get("d2") is None  # lapsed
    cache.keep("d2", _principal("tok_2"), cache.ticket())
    cache.changed(Changes(everything=True))
    assert cache.get("d2") is None


def test_a_read_that_began_before_a_revocation_is_not_kept() -> None:
    cache = TokenCache(ttl_s=60)
    ticket = cache.ticket()  # the token's row read ... while a revocation commits
    cache.changed(Changes(tokens={"tok_other"}))
    cache.keep("d1", _principal("tok_1"), ticket)
    assert cache.get("d1") is None
    # Writes of runs alone revoke nothing: a read across them is kept.
    ticket = cache.ticket()
    cache.changed(Changes(runs={"run_a": object()}))  # type: ignore[dict-item]
    cache.keep("d1", _principal("tok_1"), ticket)
    assert cache.get("d1") is not None


def test_the_cache_holds_at_most_its_tokens_and_nothing_with_a_bound_of_zero() -> None:
    cache = TokenCache(ttl_s=60, max_tokens=3)
    for n in range(5):
        cache.keep(f"d{n}", _principal(f"tok_{n}"), cache.ticket())
    assert [cache.get(f"d{n}") is not None for n in range(5)] == [False, False, True, True, True]
    off = TokenCache(ttl_s=0)
    off.keep("d", _principal("tok"), off.ticket())
    assert off.get("d") is None


def test_a_revocation_is_told_to_the_commit_listeners_by_token_id(tmp_path: Any) -> None:
    url = f"sqlite:///{tmp_path}/tokens.db"
    upgrade(url)
    db = Database(url)
    told: list[Changes] = []
    db.on_commit(told.append)
    try:
        with db.transaction() as s:
            row, _secret = tokens.create(s, "u", "t", "viewer")
        assert not told  # a new token revokes nothing
        with db.transaction() as s:
            tokens.revoke(s, row.id)
        assert [c.tokens for c in told] == [{row.id}] and not told[0].everything
    finally:
        db.dispose()


def _app(db_url: str, **settings: Any) -> TestClient:
    settings = {"signin_cache_s": TTL_S, **settings}
    return TestClient(
        create_app(
            make_settings(db_url, "http://127.0.0.1:9", run_loops=False, auth="on", **settings)
        )
    )


def _token(db_url: str, role: str = "admin") -> tuple[str, dict[str, str]]:
    db = Database(db_url)
    try:
        with db.transaction() as s:
            row, secret = tokens.create(s, "u", "t", role)  # type: ignore[arg-type]
    finally:
        db.dispose()
    return row.id, {"Authorization": f"Bearer {secret}"}


def test_a_kept_token_reads_nothing_and_a_revocation_here_refuses_it_at_once(db_url: str) -> None:
    with _app(db_url) as client:
        token_id, auth = _token(db_url)
        assert client.get("/whoami", headers=auth).status_code == 200
        with statements(client.app.state.services.db, "SELECT") as queries:  # type: ignore[attr-defined]
            assert client.get("/whoami", headers=auth).status_code == 200
        assert not [q for q in queries if "api_tokens" in q], queries
        assert client.delete(f"/tokens/{token_id}", headers=auth).status_code == 200
        assert client.get("/whoami", headers=auth).status_code == 401


def test_another_process_revoking_is_seen_within_the_bound_and_the_cli_waits_it_out(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with _app(db_url, signin_cache_s=1.5) as client:
        token_id, auth = _token(db_url)
        assert client.get("/whoami", headers=auth).status_code == 200
        # Another process's write that tells no one (no change feed): trusted until the bound.
        other = Database(db_url)
        try:
            with other.transaction() as s:
                tokens.revoke(s, token_id)
        finally:
            other.dispose()
        if "sqlite" in db_url:
            assert client.get("/whoami", headers=auth).status_code == 200
        time.sleep(1.5)
        assert client.get("/whoami", headers=auth).status_code == 401

        # The CLI answers once no replica can trust the token any more.
        second, auth = _token(db_url)
        assert client.get("/whoami", headers=auth).status_code == 200
        monkeypatch.setenv("RLRUN_DATABASE_URL", db_url)
        monkeypatch.setenv("RLRUN_SIGNIN_CACHE_S", "1.5")
        started = time.monotonic()
        assert CliRunner().invoke(cli, ["token", "revoke", second]).exit_code == 0
        assert time.monotonic() - started >= 1.5
        assert client.get("/whoami", headers=auth).status_code == 401


@pytest.fixture
def replicas(pg_database: str) -> Iterator[list[TestClient]]:
    truncate(pg_database)
    with ExitStack() as stack:
        yield [stack.enter_context(_app(pg_database)) for _ in range(2)]


@pytest.mark.postgres
def test_on_postgresql_a_revocation_is_refused_at_once_by_every_replica(
    replicas: list[TestClient], pg_database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    a, b = replicas
    for revoke in ("api", "cli"):
        token_id, auth = _token(pg_database)
        assert a.get("/whoami", headers=auth).status_code == 200
        assert b.get("/whoami", headers=auth).status_code == 200  # kept on both
        if revoke == "api":
            assert a.delete(f"/tokens/{token_id}", headers=auth).status_code == 200
        else:
            monkeypatch.setenv("RLRUN_DATABASE_URL", pg_database)
            monkeypatch.setenv("RLRUN_SIGNIN_CACHE_S", "0")  # no wait: only the feed tells
            assert CliRunner().invoke(cli, ["token", "revoke", token_id]).exit_code == 0
        started = time.monotonic()
        while b.get("/whoami", headers=auth).status_code != 401:
            assert time.monotonic() - started < 5.0, f"{revoke}: B still trusts the token"
            time.sleep(0.05)
        assert a.get("/whoami", headers=auth).status_code == 401
