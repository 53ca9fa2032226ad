"""One exception tree, rendered as RFC 9457 problem+json by one set of handlers."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from sqlalchemy.exc import DataError
from starlette.exceptions import HTTPException as StarletteHTTPException

PROBLEM_JSON = "application/problem+json"


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
        slug = self.title.lower().replace(" ", "-")
        out: dict[str, Any] = {
            "type": f"urn:rlrun:problem:{slug}",
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
    status = 503
    title = "Service unavailable"


class Busy(Unavailable):
    """A passing shortage: try again shortly (``Retry-After``)."""

    title = "Service busy"
    retry_after_s: ClassVar[int] = 1

    def __init__(self, detail: str, **extra: Any) -> None:
        super().__init__(detail, **extra)
        self.headers["Retry-After"] = str(self.retry_after_s)


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


def _problem(request: Request, exc: ProblemError) -> JSONResponse:
    return problem_response(exc, request.url.path)


def install_handlers(app: FastAPI) -> None:
    async def on_problem(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, ProblemError)
        return _problem(request, exc)

    async def on_validation(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        return _problem(request, invalid_from_pydantic(exc))

    async def on_http(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        err = ProblemError(str(exc.detail))
        body = err.body(request.url.path) | {
            "status": exc.status_code,
            "title": _reason(exc.status_code),
        }
        return JSONResponse(
            body,
            status_code=exc.status_code,
            media_type=PROBLEM_JSON,
            headers=getattr(exc, "headers", None),
        )

    async def on_data_error(request: Request, exc: Exception) -> JSONResponse:
        # The driver's message quotes the offending value: it is not passed on.
        return _problem(request, Unstorable("a value in the request cannot be stored or compared"))

    app.add_exception_handler(ProblemError, on_problem)
    app.add_exception_handler(DataError, on_data_error)
    app.add_exception_handler(RequestValidationError, on_validation)
    app.add_exception_handler(StarletteHTTPException, on_http)


def _reason(status: int) -> str:
    from http import HTTPStatus

    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Error"
