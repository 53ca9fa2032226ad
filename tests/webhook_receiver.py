"""A local webhook receiver for tests and benchmarks: verifies every message with the
``standardwebhooks`` package (the subscription's secret by path), records when each arrived and
what it answered, and can fail every n-th call."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from standardwebhooks import Webhook as Verifier
from standardwebhooks.webhooks import WebhookVerificationError


@dataclass(frozen=True)
class Received:
    path: str
    webhook_id: str
    at: float  # time.time() on arrival
    status: int  # what the receiver answered
    message: dict[str, Any] | None  # the verified message; None if it did not verify
    complete: bool  # the whole body came (a sender killed mid-send sends part of one)


class _QuietServer(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a sender killed mid-call resets its connection: expected here


class VerifyingReceiver:
    def __init__(self, fail_every: int = 0, delay_s: float = 0.0) -> None:
        self.secrets: dict[str, str] = {}  # path -> whsec_...
        self.calls: list[Received] = []
        self.fail_every, self.delay_s = fail_every, delay_s
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["content-length"]))
                receiver._take(self, body)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = _QuietServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def _take(self, handler: BaseHTTPRequestHandler, body: bytes) -> None:
        at = time.time()
        headers = {k.lower(): v for k, v in handler.headers.items()}
        message: dict[str, Any] | None = None
        complete = len(body) == int(headers.get("content-length", -1))
        with contextlib.suppress(KeyError, WebhookVerificationError):
            message = Verifier(self.secrets[handler.path]).verify(body, headers)
        with self._lock:
            n = len(self.calls) + 1
            if message is None:
                status = 400
            elif self.fail_every and n % self.fail_every == 0:
                status = 500
            else:
                status = 200
            self.calls.append(
                Received(handler.path, headers.get("webhook-id", ""), at, status, message, complete)
            )
        time.sleep(self.delay_s)  # taken, not yet answered: a sender that dies now sends again
        answer = json.dumps({"ok": status == 200}).encode()
        handler.send_response(status)
        handler.send_header("content-length", str(len(answer)))
        handler.end_headers()
        handler.wfile.write(answer)

    def taken(self) -> list[Received]:
        """The calls it answered 200 (each verified)."""
        with self._lock:
            return [c for c in self.calls if c.status == 200]

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
