"""Idempotent replays: keyed by the caller's identity (token id, OIDC subject digest), not by
user and team names, and answered only after the team and priority checks."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from service.api.auth import Principal
from service.app import create_app
from service.operations.idempotency import scoped_key
from tests.conftest import make_settings
from tests.factories import migrated_with_tokens

SPEC = {"recipe": "test-script"}


@pytest.fixture
def tokens(db_url: str) -> dict[str, str]:
    """Two tokens of the same user name and team, and a member of another team."""
    alice = ("alice", "vision", "member")
    first, second = migrated_with_tokens(db_url, alice, alice)
    return {"first": first, "second": second}


def app_for(db_url: str, **overrides: Any) -> TestClient:
    settings = make_settings(db_url, "http://127.0.0.1:9", run_loops=False, auth="on", **overrides)
    return TestClient(create_app(settings))


def post(client: TestClient, token: str, key: str, body: dict[str, Any]) -> Any:
    headers = {"Authorization": f"Bearer {token}", "Idempotency-Key": key}
    return client.post("/runs", json=body, headers=headers)


def test_an_equal_key_of_another_token_is_another_key(db_url: str, tokens: dict[str, str]) -> None:
    with app_for(db_url) as client:
        first = post(client, tokens["first"], "k1", SPEC)
        assert first.status_code == 201 and "idempotent-replayed" not in first.headers
        replay = post(client, tokens["first"], "k1", SPEC)
        assert replay.headers["idempotent-replayed"] == "true"
        assert replay.json()["id"] == first.json()["id"]
        # Same user and team names, another token: its own run, not the first one's answer.
        other = post(client, tokens["second"], "k1", SPEC)
        assert other.status_code == 201 and "idempotent-replayed" not in other.headers
        assert other.json()["id"] != first.json()["id"]


def test_a_replay_is_refused_once_the_priority_is_no_longer_the_callers(
    db_url: str, tokens: dict[str, str]
) -> None:
    body = SPEC | {"priority": "high"}
    with app_for(db_url, high_priority_teams=["vision"]) as client:
        assert post(client, tokens["first"], "k2", body).status_code == 201
    with app_for(db_url) as client:  # the grant withdrawn
        replay = post(client, tokens["first"], "k2", body)
        assert replay.status_code == 403, replay.text
        assert "idempotent-replayed" not in replay.headers


def test_a_key_naming_another_team_is_refused_before_the_key_is_looked_up(
    db_url: str, tokens: dict[str, str]
) -> None:
    with app_for(db_url) as client:
        assert post(client, tokens["first"], "k3", SPEC).status_code == 201
        # A 409 ("key used with another body") would tell this caller the key exists.
        resp = post(client, tokens["first"], "k3", SPEC | {"team": "speech"})
        assert resp.status_code == 403, resp.text


def test_keys_are_scoped_by_identity_not_names() -> None:
    a = Principal(user="alice", team="vision", role="member", token_id="tok_a")
    b = Principal(user="alice", team="vision", role="member", token_id="tok_b")
    oidc = Principal(user="alice", team="vision", role="member", token_id="oidc:1234")
    keys = {scoped_key(p, "k") for p in (a, b, oidc)}
    assert len(keys) == 3
    assert scoped_key(a, "") is None
