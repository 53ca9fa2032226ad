"""The exception tree's handlers: every error the service raises, the framework's own (404 no
route, 405, 413...), a refused or lost database and anything unexpected, answered as RFC 9457
problem+json (``service.errors``)."""

from __future__ import annotations

import logging
import uuid
from http import HTTPStatus

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from sqlalchemy.exc import DataError, DBAPIError, OperationalError
from starlette.exceptions import HTTPException as StarletteHTTPException

from service.errors import (
    PROBLEM_JSON,
    Conflict,
    ContentTooLarge,
    NotFound,
    ProblemError,
    Unavailable,
    Unstorable,
    invalid_from_pydantic,
    problem_type,
)

log = logging.getLogger(__name__)

_BY_STATUS: dict[int, type[ProblemError]] = {
    cls.status: cls for cls in (NotFound, Conflict, ContentTooLarge, Unavailable)
}


def problem_response(exc: ProblemError, path: str | None = None) -> JSONResponse:
    return JSONResponse(
        exc.body(path), status_code=exc.status, media_type=PROBLEM_JSON, headers=exc.headers or None
    )


async def answer_exception(request: Request, exc: Exception) -> Response:
    """``exc`` answered by the app's handler for it, as if a route had raised it (for a request
    answered before routing)."""
    handlers = request.app.exception_handlers
    handler = next(handlers[cls] for cls in type(exc).__mro__ if cls in handlers)
    response: Response = await handler(request, exc)
    return response


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
