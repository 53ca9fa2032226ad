"""A real HTTP server in a thread (uvicorn) and an SSE client that resumes with Last-Event-ID."""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
import uvicorn
from fastapi import FastAPI

from service.client import parse_sse


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class ServerThread:
    """``with ServerThread(app) as url:`` serves ``app`` (lifespan included) until exit."""

    def __init__(self, app: FastAPI, port: int | None = None) -> None:
        self.port = port or free_port()
        config = uvicorn.Config(
            app, host="127.0.0.1", port=self.port, log_level="warning", timeout_graceful_shutdown=1
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> str:
        self.thread.start()
        deadline = time.monotonic() + 120
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("server did not start")
            time.sleep(0.05)
        return f"http://127.0.0.1:{self.port}"

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(60)


@dataclass
class Event:
    kind: str
    id: str | None
    data: Any


@dataclass
class SseClient:
    """Reads ``/runs/{id}/events`` in a thread; reconnects with Last-Event-ID until ``end``."""

    run_id: str
    base_url: str
    events: list[Event] = field(default_factory=list)
    last_id: str | None = None
    connections: int = 0
    ended: threading.Event = field(default_factory=threading.Event)
    received: threading.Condition = field(default_factory=threading.Condition)

    def start(self) -> SseClient:
        threading.Thread(target=self._run, daemon=True).start()
        return self

    def _run(self) -> None:
        while not self.ended.is_set():
            try:
                self._connect_once()
            except httpx.HTTPError:
                time.sleep(0.3)

    def _connect_once(self) -> None:
        headers = {"Last-Event-ID": self.last_id} if self.last_id else {}
        url = f"{self.base_url}/runs/{self.run_id}/events"
        with httpx.stream("GET", url, headers=headers, timeout=httpx.Timeout(5, read=60)) as r:
            r.raise_for_status()
            self.connections += 1
            for event in parse_sse(r.iter_lines()):
                self._deliver(Event(event.kind, event.id, event.data))

    def _deliver(self, event: Event) -> None:
        with self.received:
            if event.kind == "end":
                self.ended.set()
            else:
                self.events.append(event)
            if event.id:
                self.last_id = event.id
            self.received.notify_all()

    def move_to(self, base_url: str) -> None:
        """The next reconnection goes to another server (the restarted service)."""
        self.base_url = base_url

    def wait(self, predicate: Any, timeout: float = 120) -> None:
        with self.received:
            if not self.received.wait_for(lambda: predicate(self), timeout):
                raise AssertionError(f"timed out; {len(self.events)} events so far")

    def metrics(self) -> list[tuple[int, dict[str, Any]]]:
        return [(e.data["step"], e.data["values"]) for e in self.events if e.kind == "metrics"]

    def statuses(self) -> list[str]:
        return [
            e.data["to_status"]
            for e in self.events
            if e.kind == "status" and e.data["from_status"] != e.data["to_status"]
        ]


def status_from(source: str, url: str, method: str, path: str, token: str) -> int:
    """The status of one bodiless request to ``url`` (``http://host:port``) sent from the local
    address ``source`` (any of 127/8 on loopback), over a connection of its own."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30, source_address=(source, 0)) as s:
        head = (
            f"{method} {path} HTTP/1.1\r\nHost: {host}:{port}\r\nAuthorization: Bearer {token}\r\n"
            "Content-Length: 0\r\nConnection: close\r\n\r\n"
        )
        s.sendall(head.encode())
        first = s.makefile("rb").readline().split()
    return int(first[1])
