"""The request body: read only once the caller is known, within a size and a time bound.

A request that carries a body is authenticated from its headers first (auth on): a caller
without a valid token gets its 401 before a byte of the body is read. The body is then read
whole, here, before the request goes further in: a body over ``max_bytes`` is a 413 (declared
or streamed), one that has not arrived within ``timeout_s`` a 408. Load shedding (inside this)
counts a request only once its body is in, so clients that send headers and then nothing hold
no slot other callers need; each holds only its connection, and only until the timeout.
"""

from __future__ import annotations

import anyio
from sqlalchemy.exc import DBAPIError, OperationalError
from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.api.auth import PRINCIPAL_KEY, bearer, client_of, resolve
from service.api.deps import Services
from service.api.problems import problem_response
from service.errors import ContentTooLarge, ProblemError, RequestTimeout, Unavailable


class BodyLimit:
    def __init__(self, app: ASGIApp, max_bytes: int, timeout_s: float) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.timeout_s = timeout_s

    def _too_large(self) -> ContentTooLarge:
        return ContentTooLarge(f"the request body is larger than {self.max_bytes} bytes")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        declared = headers.get("content-length", "")
        if declared.isdigit() and int(declared) > self.max_bytes:
            await problem_response(self._too_large(), scope["path"])(scope, receive, send)
            return
        if not has_body(headers):
            await self.app(scope, receive, send)
            return
        try:
            await authenticate(scope)
            body = await self._read(receive)
        except DBAPIError as exc:
            # As the routes' handler answers it: the database away is a 503 to retry.
            if not (isinstance(exc, OperationalError) or exc.connection_invalidated):
                raise
            unavailable = Unavailable("the database cannot be reached; retry shortly")
            await problem_response(unavailable, scope["path"])(scope, receive, send)
            return
        except ProblemError as exc:
            await problem_response(exc, scope["path"])(scope, receive, send)
            return
        if body is None:  # the client went away
            return
        await self.app(
            scope,
            replaying({"type": "http.request", "body": body, "more_body": False}, receive),
            send,
        )

    async def _read(self, receive: Receive) -> bytes | None:
        chunks: list[bytes] = []
        size = 0
        with anyio.move_on_after(self.timeout_s) as deadline:
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    return None
                chunk = message.get("body", b"")
                size += len(chunk)
                if size > self.max_bytes:
                    raise self._too_large()
                chunks.append(chunk)
                if not message.get("more_body", False):
                    return b"".join(chunks)
        assert deadline.cancelled_caught
        raise RequestTimeout(f"the request body did not arrive within {self.timeout_s:g} s")


def replaying(message: Message, receive: Receive) -> Receive:
    """``receive`` that first gives ``message`` (a body already read), then what the client
    sends next (the disconnect a streaming answer listens for)."""
    given = False

    async def again() -> Message:
        nonlocal given
        if given:
            return await receive()
        given = True
        return message

    return again


def has_body(headers: Headers) -> bool:
    return headers.get("content-length", "0") not in ("", "0") or "transfer-encoding" in headers


async def authenticate(scope: Scope) -> None:
    """With auth on, the caller from the request's headers, kept in the scope for the route;
    a ``ProblemError`` (401, or 503 while an identity provider is away) if there is none."""
    services: Services = scope["app"].state.services
    if not services.settings.auth_enabled:
        return
    request = Request(scope)
    credentials = await bearer(request)
    scope[PRINCIPAL_KEY] = await resolve(services, credentials, client_of(request))
