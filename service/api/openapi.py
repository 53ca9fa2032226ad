"""The OpenAPI document as the API answers: every error is a problem+json ``Problem``, and each
operation lists the errors it can give (401/403 behind a token, and 503 when the identity
provider's keys cannot be fetched; 404 on a named resource, 422 when it takes input, 429 where a
limit applies)."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel, ConfigDict

from service.errors import PROBLEM_JSON


class FieldError(BaseModel):
    loc: list[str | int]
    field: str
    msg: str
    type: str


class Problem(BaseModel):
    """RFC 9457 problem details; 422s add ``errors``, some problems add more members."""

    model_config = ConfigDict(extra="allow")

    type: str
    title: str
    status: int
    detail: str
    instance: str | None = None
    errors: list[FieldError] | None = None


REASONS = {
    400: "Bad request",
    401: "No valid bearer token (an API token or the identity provider's JWT)",
    403: "The token's role or team does not allow this",
    404: "Not found (or another team's)",
    409: "Conflict",
    413: "Request body too large",
    422: "Invalid input",
    429: "Too many requests (see Retry-After)",
    503: "Service unavailable",
}
REF = {"$ref": "#/components/schemas/Problem"}


def install(app: FastAPI) -> None:
    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = _with_problems(
                get_openapi(
                    title=app.title,
                    version=app.version,
                    summary=app.summary,
                    routes=app.routes,
                )
            )
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def _with_problems(doc: dict[str, Any]) -> dict[str, Any]:
    schemas = doc.setdefault("components", {}).setdefault("schemas", {})
    problem = Problem.model_json_schema(ref_template="#/components/schemas/{model}")
    schemas.update(problem.pop("$defs", {}))
    schemas["Problem"] = problem
    for name in ("HTTPValidationError", "ValidationError"):
        schemas.pop(name, None)
    for path, operations in doc.get("paths", {}).items():
        for op in operations.values():
            statuses = {400}  # the Host allow-list, for every call
            if op.get("security"):
                statuses |= {401, 403, 503}
            if "{" in path:
                statuses.add(404)
            if op.get("parameters") or op.get("requestBody"):
                statuses.add(422)
            if op.get("requestBody"):
                statuses.add(413)
            responses = op.setdefault("responses", {})
            for status in statuses:
                responses.setdefault(str(status), {"description": REASONS[status]})
            for status, response in responses.items():
                if status[0] in "45":
                    response["content"] = {PROBLEM_JSON: {"schema": REF}}
                    response.setdefault("description", REASONS.get(int(status), "Error"))
    return doc
