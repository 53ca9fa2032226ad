"""The two requests a busy service sees most, answered before routing: ``GET /runs/{id}``,
which pollers repeat, and ``POST /runs``. For a caller known without a read (open mode, an API
token the sign-in cache vouches for, or the caller the door resolved before reading a body) each
costs the HTTP stack and its own work, and none of FastAPI's routing and dependency solving (a
fifth of a kept read, a fifth of an accept).

Each answer is the route's own. A read is ``runs.read_run`` (the same read cache, body, ``ETag``
and 304, the same visibility rule, the same problem for a run that does not exist or a database
busy or away, read once). An accept is ``accept.accept_run`` answered by ``runs.accepted`` (the
same checks, validation slot, status, body and headers), its problems by the app's own exception
handlers. Whatever cannot be answered so goes on to the route unchanged, with its body, and the
route says why: a token to look up, a run the caller may not see, a dry run or another query, a
body that is not a JSON object, a header longer than the route allows, an unexpected error of a
read.
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any

import anyio.to_thread
from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.api import runs
from service.api.auth import ANONYMOUS, PRINCIPAL_KEY, client_of, known_caller
from service.api.body_limit import replaying
from service.api.deps import Services
from service.api.problems import answer_exception, problem_response
from service.api.read_cache import respond
from service.errors import ProblemError
from service.operations import accept
from service.principal import Principal

log = logging.getLogger(__name__)
RUN_PATH = re.compile(r"/runs/([^/]+)")


def _route(endpoint: Any) -> BaseRoute:
    """The route of ``endpoint`` (its template labels the request's metrics)."""
    return next(r for r in runs.router.routes if getattr(r, "endpoint", None) is endpoint)


async def _answer(
    route: BaseRoute, response: Response, scope: Scope, receive: Receive, send: Send
) -> None:
    scope["route"] = route
    await response(scope, receive, send)


class DirectRunReads:
    """ASGI middleware, innermost: ``GET /runs/{id}`` answered before the router."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.route = _route(runs.get_run)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # A query (``baseline=true``) goes to the route.
        if scope["type"] == "http" and scope["method"] == "GET" and not scope["query_string"]:
            match = RUN_PATH.fullmatch(scope["path"])
            services: Services | None = getattr(scope["app"].state, "services", None)
            if (
                match is not None
                and services is not None
                and await self._answered(services, match.group(1), scope, receive, send)
            ):
                return
        await self.app(scope, receive, send)

    async def _answered(
        self, services: Services, run_id: str, scope: Scope, receive: Receive, send: Send
    ) -> bool:
        headers = Headers(scope=scope)
        if_none_match = headers.get("if-none-match")
        if if_none_match is not None and len(if_none_match) > runs.MAX_IF_NONE_MATCH:
            return False
        principal = known_caller(services, headers.get("authorization"))
        if principal is None:
            return False
        try:
            answer = await runs.read_run(services, run_id)
        except ProblemError as exc:  # no such run, the database busy or away: as the route says
            response: Response = problem_response(exc, Request(scope).url.path)
        except Exception as exc:  # what the route's handlers answer (reading again)
            log.debug("GET /runs/%s goes to its route: %r", run_id, exc)
            return False
        else:
            if not principal.sees(answer.team):
                return False
            response = respond(answer, if_none_match)
        await _answer(self.route, response, scope, receive, send)
        return True


class DirectAccept:
    """ASGI middleware inside the load shedding: ``POST /runs`` (no query: not a dry run)
    answered before the router, its body already read whole at the door (``body_limit``)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.route = _route(runs.create_run)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] == "http"
            and scope["method"] == "POST"
            and scope["path"] == "/runs"
            and not scope["query_string"]
        ):
            services: Services | None = getattr(scope["app"].state, "services", None)
            first = await receive()
            if services is not None and await self._answered(services, first, scope, receive, send):
                return
            receive = replaying(first, receive)
        await self.app(scope, receive, send)

    async def _answered(
        self, services: Services, first: Message, scope: Scope, receive: Receive, send: Send
    ) -> bool:
        headers = Headers(scope=scope)
        key = headers.get("idempotency-key")  # the first, as the route reads it
        principal = scope.get(PRINCIPAL_KEY) if services.settings.auth_enabled else ANONYMOUS
        if (
            not isinstance(principal, Principal)
            or not principal.at_least("member")
            or (key is not None and len(key) > runs.MAX_IDEMPOTENCY_KEY)
        ):
            return False
        spec = _json_object(first, headers)
        if spec is None:
            return False
        request = Request(scope, receive)
        try:
            with runs.validation_slot_of(services, principal):
                done = await anyio.to_thread.run_sync(
                    accept.accept_run,
                    services,
                    principal,
                    spec,
                    key,
                    client_of(request),
                )
            response: Response = runs.accepted(done)
        except Exception as exc:  # never on to the route: an accept is not tried twice
            response = await answer_exception(request, exc)
        await _answer(self.route, response, scope, receive, send)
        return True


def _json_object(message: Message, headers: Headers) -> dict[str, Any] | None:
    """The body of ``message`` if it is all of it, sent as JSON, and a JSON object; else None
    (the route parses it and says what is wrong)."""
    if message["type"] != "http.request" or message.get("more_body", False):
        return None
    # A body without a content type is no JSON to the route either (strict content types).
    content_type = headers.get("content-type") or ""
    if content_type.partition(";")[0].strip().lower() != "application/json":
        return None
    try:
        doc = json.loads(message.get("body", b""))
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None
