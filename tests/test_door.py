"""The HTTP door on a real server: bodies are read only after the caller is known, and only for
so long; clients that send headers and then nothing cannot crowd out anyone else."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
from fastapi.testclient import TestClient

from service.app import create_app
from service.store.db import upgrade
from tests.conftest import make_settings, served
from tests.factories import sqlite_with_tokens

HEAD = (
    "POST /runs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    "Content-Length: 100\r\n{auth}\r\n"
)


@contextmanager
def stalled_posts(url: str, count: int, token: str | None = None) -> Iterator[list[socket.socket]]:
    """``count`` connections that send the headers of ``POST /runs`` and never the body."""
    port = int(url.rsplit(":", 1)[1])
    auth = f"Authorization: Bearer {token}\r\n" if token else ""
    sockets = []
    try:
        for _ in range(count):
            sock = socket.create_connection(("127.0.0.1", port), timeout=30)
            sock.sendall(HEAD.format(auth=auth).encode())
            sockets.append(sock)
        yield sockets
    finally:
        for sock in sockets:
            sock.close()


def answer_of(sock: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(4096)
        if not chunk:
            break
        data += chunk
    return data


def member_token(tmp_path: Any) -> tuple[str, str]:
    """A migrated SQLite database of the test's with a member's token: its URL, the secret."""
    url, [token] = sqlite_with_tokens(tmp_path, "db.sqlite", ("flooder", "vision", "member"))
    return url, token


def reads_stay_fast(url: str, seconds: float, headers: dict[str, str]) -> list[float]:
    """``GET /runs`` from another client for ``seconds``: each answer 200, the latencies."""
    latencies = []
    with httpx.Client(base_url=url, headers=headers, timeout=10) as client:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            started = time.monotonic()
            resp = client.get("/runs")
            latencies.append(time.monotonic() - started)
            assert resp.status_code == 200, resp.text
    return latencies


def test_stalled_bodies_hold_no_slot_other_callers_need(tmp_path: Any) -> None:
    """150 connections with the headers of a POST and no body (more than the 128 requests in
    progress the service admits): other callers' reads answer 200 within 1 s throughout."""
    url = f"sqlite:///{tmp_path}/db.sqlite"
    with served(url, body_timeout_s=30) as server, stalled_posts(server, 150):
        time.sleep(0.5)  # every connection is in and waiting for its body
        latencies = reads_stay_fast(server, 3, {})
    assert max(latencies) < 1.0, max(latencies)


def test_stalled_bodies_of_a_member_hold_no_slot_with_auth_on(tmp_path: Any) -> None:
    url, token = member_token(tmp_path)
    auth = {"Authorization": f"Bearer {token}"}
    with served(url, auth="on", body_timeout_s=30) as server, stalled_posts(server, 150, token):
        time.sleep(0.5)
        latencies = reads_stay_fast(server, 3, auth)
    assert max(latencies) < 1.0, max(latencies)


def test_the_caller_is_checked_before_the_body_is_read(tmp_path: Any) -> None:
    """Without a valid token the answer is a 401 at once, while the body is still missing."""
    url = f"sqlite:///{tmp_path}/db.sqlite"
    upgrade(url)
    with served(url, auth="on", body_timeout_s=30) as server:
        for token in (None, "rlrun_not-a-token"):
            with stalled_posts(server, 1, token) as [sock]:
                sock.settimeout(5)
                head = answer_of(sock)
            assert head.startswith(b"HTTP/1.1 401"), head
            assert b"application/problem+json" in head


def test_a_body_that_does_not_arrive_in_time_is_a_408(tmp_path: Any) -> None:
    url = f"sqlite:///{tmp_path}/db.sqlite"
    with served(url, body_timeout_s=0.5) as server:
        with stalled_posts(server, 1) as [sock]:
            sock.sendall(b'{"recipe": ')  # a start, then nothing
            sock.settimeout(10)
            started = time.monotonic()
            head = answer_of(sock)
            waited = time.monotonic() - started
            assert head.startswith(b"HTTP/1.1 408"), head
            assert b"application/problem+json" in head
            assert 0.3 < waited < 5, waited
            rest = sock.recv(65536)  # the problem body, then the server closes
            while rest:
                rest = sock.recv(65536)
        # A whole body in time is served as before.
        made = httpx.post(f"{server}/runs", json={"recipe": "test-script"}, timeout=10)
        assert made.status_code == 201, made.text


def test_a_body_request_while_the_database_is_away_is_a_503(tmp_path: Any) -> None:
    """The caller is checked at the door now: a database that cannot be reached there is the
    same 503 with Retry-After the routes answer, not a 500."""
    settings = make_settings(
        "postgresql+psycopg://rlrun@127.0.0.1:1/none",
        "http://127.0.0.1:9",
        run_loops=False,
        auth="on",
        migrate_on_start=False,
        db_wait_s=1,
    )
    with TestClient(create_app(settings)) as client:
        resp = client.post(
            "/runs", json={"recipe": "test-script"}, headers={"Authorization": "Bearer rlrun_x"}
        )
    assert resp.status_code == 503, resp.text
    assert resp.headers["content-type"] == "application/problem+json"
    assert "retry-after" in resp.headers
