"""Open mode (auth off, on loopback): only loopback Host names are answered (DNS rebinding),
another site cannot change anything (Origin / Sec-Fetch-Site), and no token is minted over
HTTP."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from service.api.open_mode import host_name
from service.app import create_app
from service.store import tokens
from service.store.db import Database
from tests.conftest import make_settings

OWN = "127.0.0.1:8000"
SPEC = {"recipe": "test-script"}


@pytest.fixture
def open_api(db_url: str) -> Iterator[TestClient]:
    """Open mode with no extra host names, as deployed; requests to 127.0.0.1:8000."""
    settings = make_settings(db_url, "http://127.0.0.1:9", run_loops=False, open_mode_hosts=[])
    with TestClient(create_app(settings), base_url=f"http://{OWN}") as client:
        yield client


def test_host_names_lose_their_port_only() -> None:
    assert host_name("LocalHost:8000") == "localhost"
    assert host_name("[::1]:80") == "[::1]"
    assert host_name("127.0.0.1") == "127.0.0.1"
    assert host_name("127.0.0.1:x") == "127.0.0.1:x"
    assert host_name("[::1]evil:1") == "[::1]"


@pytest.mark.parametrize("host", ["127.0.0.1:8000", "localhost", "LOCALHOST:1", "[::1]:9"])
def test_loopback_host_names_are_answered(open_api: TestClient, host: str) -> None:
    assert open_api.get("/runs", headers={"Host": host}).status_code == 200


@pytest.mark.parametrize(
    "host", ["evil.example", "evil.example:8000", "127.0.0.1.nip.io", "localhost.evil", "0.0.0.0"]
)
def test_other_host_names_are_refused(open_api: TestClient, host: str) -> None:
    for method, path in (("GET", "/runs"), ("POST", "/runs"), ("GET", "/ui/")):
        resp = open_api.request(method, path, headers={"Host": host}, json=SPEC)
        assert resp.status_code == 400, (method, path, resp.text)
        assert resp.headers["content-type"] == "application/problem+json"
    assert open_api.get("/runs").json()["items"] == []


@pytest.mark.parametrize(
    "headers",
    [
        {"Origin": "http://evil.example"},
        {"Origin": "null"},
        {"Origin": "http://127.0.0.1:9999"},  # another service on this machine
        {"Sec-Fetch-Site": "cross-site"},
        {"Origin": f"http://{OWN}", "Sec-Fetch-Site": "cross-site"},
    ],
)
def test_a_cross_site_request_changes_nothing(
    open_api: TestClient, headers: dict[str, str]
) -> None:
    run_id = open_api.post("/runs", json=SPEC).json()["id"]
    made = open_api.post("/runs", json=SPEC, headers=headers)
    assert made.status_code == 403, made.text
    assert made.headers["content-type"] == "application/problem+json"
    cancel = open_api.post(f"/runs/{run_id}/cancel", headers=headers)
    assert cancel.status_code == 403
    assert open_api.get(f"/runs/{run_id}").json()["status"] == "QUEUED"
    assert len(open_api.get("/runs").json()["items"]) == 1
    # Reading is not changing: a read from anywhere is answered (a browser keeps it from the
    # other site's page anyway).
    assert open_api.get("/runs", headers=headers).status_code == 200


@pytest.mark.parametrize(
    "headers",
    [{"Origin": f"http://{OWN}"}, {"Sec-Fetch-Site": "same-origin"}, {"Sec-Fetch-Site": "none"}],
)
def test_the_services_own_pages_and_clients_still_change_state(
    open_api: TestClient, headers: dict[str, str]
) -> None:
    made = open_api.post("/runs", json=SPEC, headers=headers)
    assert made.status_code == 201, made.text
    assert open_api.post(f"/runs/{made.json()['id']}/cancel", headers=headers).status_code == 200


def test_no_token_is_minted_over_http_in_open_mode(open_api: TestClient, db_url: str) -> None:
    resp = open_api.post("/tokens", json={"user": "mallory", "team": "vision", "role": "admin"})
    assert resp.status_code == 403, resp.text
    assert "rlrun token create" in resp.json()["detail"]
    db = Database(db_url)
    with db.read() as s:
        assert tokens.page(s, 10) == []
    db.dispose()
