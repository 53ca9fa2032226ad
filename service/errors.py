"""One exception tree, rendered as RFC 9457 problem+json by one set of handlers."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from http import HTTPStatus
from typing import Any, ClassVar

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from sqlalchemy.exc import DataError, DBAPIError, OperationalError
from starlette.exceptions import HTTPException as StarletteHTTPException

PROBLEM_JSON = "application/problem+json"
log = logging.getLogger(__name__)


class ProblemError(Exception):
    """Base of every error the API reports; subclasses fix status and title."""

    status: ClassVar[int] = 500
    title: ClassVar[str] = "Internal error"

    def __init__(self, detail: str, **extra: Any) -> None:
        super().__init__(detail)
        self.detail = detail
        self.extra = extra
        self.headers: dict[str, str] = {}

    def body(self, instance: str | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {
            "type": problem_type(self.title),
            "title": self.title,
            "status": self.status,
            "detail": self.detail,
        }
        if instance:
            out["instance"] = instance
        out.update(self.extra)
        return out


class NotFound(ProblemError):
    status = 404
    title = "Not found"


class Unauthorized(ProblemError):
    """No valid bearer token (missing, unknown or revoked: the same answer for each)."""

    status = 401
    title = "Unauthorized"

    def __init__(self, detail: str = "a valid API token is required") -> None:
        super().__init__(detail)
        self.headers["WWW-Authenticate"] = "Bearer"


class Forbidden(ProblemError):
    status = 403
    title = "Forbidden"


class InvalidHost(ProblemError):
    """A ``Host`` header the service does not answer for."""

    status = 400
    title = "Invalid host"


class TooManyRequests(ProblemError):
    status = 429
    title = "Too many requests"

    def __init__(self, detail: str, retry_after_s: int) -> None:
        super().__init__(detail, retry_after_s=retry_after_s)
        self.headers["Retry-After"] = str(retry_after_s)


class Conflict(ProblemError):
    status = 409
    title = "Conflict"


class InvalidSpec(ProblemError):
    """A request that is well-formed JSON but breaks a rule; ``errors`` name the field paths."""

    status = 422
    title = "Invalid run spec"

    def __init__(self, detail: str, errors: Sequence[dict[str, Any]]) -> None:
        super().__init__(detail, errors=list(errors))


class Unstorable(ProblemError):
    """Input the database refuses to hold (a NUL character on PostgreSQL, a number too large)."""

    status = 422
    title = "Invalid input"


class Unavailable(ProblemError):
    """Try again later: every 503 says when (``Retry-After``)."""

    status = 503
    title = "Service unavailable"
    retry_after_s: ClassVar[int] = 5

    def __init__(self, detail: str, **extra: Any) -> None:
        super().__init__(detail, **extra)
        self.headers["Retry-After"] = str(self.retry_after_s)


class ContentTooLarge(ProblemError):
    status = 413
    title = "Content too large"


class RequestTimeout(ProblemError):
    """The request's body did not arrive in time; the connection is closed after the answer."""

    status = 408
    title = "Request timeout"

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.headers["Connection"] = "close"


_BY_STATUS: dict[int, type[ProblemError]] = {
    cls.status: cls for cls in (NotFound, Conflict, ContentTooLarge, Unavailable)
}


def problem_type(title: str) -> str:
    return "urn:rlrun:problem:" + title.lower().replace(" ", "-")


class Busy(Unavailable):
    """A passing shortage: try again shortly (``Retry-After``)."""

    title = "Service busy"
    retry_after_s: ClassVar[int] = 1


class DatabaseBusy(Busy):
    """The database could not be had within its bound."""


class Overloaded(Busy):
    """Too many requests in progress: this one was refused before doing anything."""


def field_error(loc: Sequence[str | int], msg: str, kind: str = "value_error") -> dict[str, Any]:
    """One entry of a 422's ``errors``: the path as a list and as a dotted ``field``."""
    return {"loc": list(loc), "field": dotted(loc), "msg": msg, "type": kind}


def dotted(loc: Sequence[str | int]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def invalid_from_pydantic(
    exc: ValidationError | RequestValidationError, prefix: Sequence[str] = ()
) -> InvalidSpec:
    errors = [
        field_error([*prefix, *(p for p in e["loc"] if p != "body")], e["msg"], e["type"])
        for e in exc.errors()
    ]
    first = errors[0]["field"] if errors else "body"
    return InvalidSpec(f"{len(errors)} invalid field(s), first: {first}", errors)


def problem_response(exc: ProblemError, path: str | None = None) -> JSONResponse:
    return JSONResponse(
        exc.body(path), status_code=exc.status, media_type=PROBLEM_JSON, headers=exc.headers or None
    )


def install_handlers(app: FastAPI) -> None:
    async def on_problem(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, ProblemError)
        return problem_response(exc, request.url.path)

    async def on_validation(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        return problem_response(invalid_from_pydantic(exc), request.url.path)

    async def on_http(request: Request, exc: Exception) -> JSONResponse:
        """The framework's own errors (404 no route, 405, 413...), typed by their status."""
        assert isinstance(exc, StarletteHTTPException)
        known = _BY_STATUS.get(exc.status_code)
        title = known.title if known else _reason(exc.status_code)
        body = {
            "type": problem_type(title),
            "title": title,
            "status": exc.status_code,
            "detail": str(exc.detail),
            "instance": request.url.path,
        }
        return JSONResponse(
            body,
            status_code=exc.status_code,
            media_type=PROBLEM_JSON,
            headers=getattr(exc, "headers", None),
        )

    async def on_data_error(request: Request, exc: Exception) -> JSONResponse:
        # The driver's message quotes the offending value: it is not passed on.
        refused = Unstorable("a value in the request cannot be stored or compared")
        return problem_response(refused, request.url.path)

    async def on_database(request: Request, exc: Exception) -> JSONResponse:
        """A lost or refused database connection is a 503 to retry; anything else a 500."""
        assert isinstance(exc, DBAPIError)
        if isinstance(exc, OperationalError) or exc.connection_invalidated:
            log.warning("database unavailable on %s %s: %s", request.method, request.url.path, exc)
            return problem_response(
                Unavailable("the database cannot be reached; retry shortly"), request.url.path
            )
        return await on_unexpected(request, exc)

    async def on_unexpected(request: Request, exc: Exception) -> JSONResponse:
        """Anything else: a 500 problem whose id is also in the log line with the traceback."""
        error_id = uuid.uuid4().hex[:16]
        log.error(
            "unexpected error %s on %s %s",
            error_id,
            request.method,
            request.url.path,
            exc_info=(type(exc), exc, exc.__traceback__),
        )
        err = ProblemError(f"an unexpected error occurred (error id {error_id})", error_id=error_id)
        return problem_response(err, request.url.path)

    app.add_exception_handler(ProblemError, on_problem)
    app.add_exception_handler(DataError, on_data_error)
    app.add_exception_handler(RequestValidationError, on_validation)
    app.add_exception_handler(StarletteHTTPException, on_http)
    app.add_exception_handler(DBAPIError, on_database)
    app.add_exception_handler(Exception, on_unexpected)


def _reason(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Error"
