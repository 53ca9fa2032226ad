"""Who uses the service and how much, as the API answers it: API tokens, the audit trail, the
caller (who-am-I) and usage reports."""

from __future__ import annotations

from datetime import date, datetime
from typing import Any

from pydantic import BaseModel, Field

from service.wire.documents import attributes

# API tokens and the audit trail


class TokenOut(BaseModel):
    id: str
    user: str
    team: str
    role: str
    created_at: datetime
    created_by: str | None
    revoked_at: datetime | None


class NewToken(TokenOut):
    token: str = Field(description="the secret: shown this once, only its hash is kept")


class TokenPage(BaseModel):
    items: list[TokenOut]
    next_cursor: str | None


def token_out(row: Any) -> dict[str, Any]:
    """A ``TokenOut`` of an ``ApiToken``."""
    return attributes(row, TokenOut.model_fields)


class AuditOut(BaseModel):
    id: int
    at: datetime
    user: str
    team: str | None
    role: str
    token_id: str | None
    action: str
    run_id: str | None
    target: str | None
    client: str | None


class AuditPage(BaseModel):
    items: list[AuditOut]
    next_cursor: int | None


# Who is calling


class WhoAmIOut(BaseModel):
    """The caller as the service sees it (open mode: an anonymous admin)."""

    user: str
    team: str | None
    role: str
    auth: bool = Field(description="whether the service asks for tokens")


# Usage


class UsageOut(BaseModel):
    """A page of a usage report; the totals are the whole report's."""

    start: date
    end: date
    group_by: list[str]
    rows: list[dict[str, Any]]
    total_rows: int = Field(description="rows of the whole report, on every page")
    total_accelerator_hours: float = Field(description="of the whole report, not the page")
    next_cursor: str | None = Field(description="pass back as cursor for the next page")
