"""One exception tree, rendered as RFC 9457 problem+json by one set of handlers
(``service.api.problems``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar, Protocol

PROBLEM_JSON = "application/problem+json"


class ProblemError(Exception):
    """Base of every error the API reports. A subclass names its status and title where it is
    declared: ``class NotFound(ProblemError, status=404, title="Not found")``."""

    status: ClassVar[int] = 500
    title: ClassVar[str] = "Internal error"
    # Headers every answer of the class carries; ``Retry-After`` where the class fixes one.
    fixed_headers: ClassVar[dict[str, str]] = {}
    retry_after_s: ClassVar[int | None] = None

    def __init_subclass__(
        cls, status: int | None = None, title: str | None = None, **kwargs: Any
    ) -> None:
        super().__init_subclass__(**kwargs)
        if status is not None:
            cls.status = status
        if title is not None:
            cls.title = title

    def __init__(self, detail: str, **extra: Any) -> None:
        super().__init__(detail)
        self.detail = detail
        self.extra = extra
        self.headers = dict(self.fixed_headers)
        if self.retry_after_s is not None:
            self.headers["Retry-After"] = str(self.retry_after_s)

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


def problem_type(title: str) -> str:
    return "urn:rlrun:problem:" + title.lower().replace(" ", "-")


class NotFound(ProblemError, status=404, title="Not found"): ...


class Forbidden(ProblemError, status=403, title="Forbidden"): ...


class Conflict(ProblemError, status=409, title="Conflict"): ...


class ContentTooLarge(ProblemError, status=413, title="Content too large"): ...


class Unauthorized(ProblemError, status=401, title="Unauthorized"):
    """No valid bearer token (missing, unknown or revoked: the same answer for each)."""

    fixed_headers: ClassVar[dict[str, str]] = {"WWW-Authenticate": "Bearer"}

    def __init__(self, detail: str = "a valid API token is required") -> None:
        super().__init__(detail)


class InvalidHost(ProblemError, status=400, title="Invalid host"):
    """A ``Host`` header the service does not answer for."""


class TooManyRequests(ProblemError, status=429, title="Too many requests"):
    def __init__(self, detail: str, retry_after_s: int) -> None:
        super().__init__(detail, retry_after_s=retry_after_s)
        self.headers["Retry-After"] = str(retry_after_s)


class InvalidSpec(ProblemError, status=422, title="Invalid run spec"):
    """A request that is well-formed JSON but breaks a rule; ``errors`` name the field paths."""

    def __init__(self, detail: str, errors: Sequence[dict[str, Any]]) -> None:
        super().__init__(detail, errors=list(errors))


class Unstorable(ProblemError, status=422, title="Invalid input"):
    """Input the database refuses to hold (a NUL character on PostgreSQL, a number too large)."""


class Unavailable(ProblemError, status=503, title="Service unavailable"):
    """Try again later: every 503 says when (``Retry-After``)."""

    retry_after_s: ClassVar[int] = 5


class RequestTimeout(ProblemError, status=408, title="Request timeout"):
    """The request's body did not arrive in time; the connection is closed after the answer."""

    fixed_headers: ClassVar[dict[str, str]] = {"Connection": "close"}


class Busy(Unavailable, title="Service busy"):
    """A passing shortage: try again shortly (``Retry-After``)."""

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


class FieldErrors(Protocol):
    """pydantic's ``ValidationError``, or the framework's validation error of a request."""

    def errors(self) -> Sequence[Any]: ...


def invalid_from_pydantic(exc: FieldErrors, prefix: Sequence[str] = ()) -> InvalidSpec:
    errors = [
        field_error([*prefix, *(p for p in e["loc"] if p != "body")], e["msg"], e["type"])
        for e in exc.errors()
    ]
    first = errors[0]["field"] if errors else "body"
    return InvalidSpec(f"{len(errors)} invalid field(s), first: {first}", errors)
