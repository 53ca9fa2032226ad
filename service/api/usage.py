"""``GET /usage``: accelerator-hours per team, user, recipe, day or accelerator: JSON in pages,
or the whole report as CSV."""

from __future__ import annotations

import base64
import binascii
import csv
import io
import json
from datetime import date, timedelta
from typing import Annotated, Any

from fastapi import APIRouter, Header, Query
from fastapi.responses import Response

from service import usage
from service.api.auth import Viewer
from service.api.deps import ServicesDep
from service.api.json_answer import json_response
from service.clock import utcnow
from service.errors import InvalidSpec, field_error
from service.wire.admin import UsageOut

router = APIRouter(tags=["usage"])

MAX_DAYS = 3 * 366
# The days a report may name: the calendar's ends are out of reach of its month arithmetic.
FIRST_DAY, LAST_DAY = date(1970, 1, 1), date(9999, 1, 1)
# Rows per page: a dashboard's month of a hundred teams by day in a few pages, at most.
LIMIT = 500
MAX_LIMIT = 10_000


@router.get(
    "/usage",
    response_model=UsageOut,
    responses={200: {"content": {"text/csv": {}}, "description": "JSON, or CSV when asked"}},
)
def read_usage(
    services: ServicesDep,
    principal: Viewer,
    start: Annotated[date | None, Query(alias="from", description="first UTC day")] = None,
    end: Annotated[date | None, Query(alias="to", description="the day after the last")] = None,
    group_by: Annotated[list[usage.GroupBy] | None, Query(description="repeat for more")] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_LIMIT, description="rows per page")] = LIMIT,
    cursor: Annotated[str | None, Query(max_length=2000, description="a next_cursor")] = None,
    accept: Annotated[str, Header()] = "application/json",
) -> Any:
    """Accelerator-seconds allocated (submitted to ended; running runs up to now) in the UTC
    days [from, to) (days from 1970-01-01 to 9999-01-01), default the last 30 days by team. A
    viewer or member sees its own team's.

    JSON comes in pages of ``limit`` rows (pass ``next_cursor`` back as ``cursor`` for the
    next), with the whole report's ``total_rows`` (as the first page counted them) and
    ``total_accelerator_hours`` on each:
    largest first, or by day (then the other groups) when grouped by day. CSV is the whole
    report, largest first."""
    for name, day in (("from", start), ("to", end)):
        if day is not None and not FIRST_DAY <= day <= LAST_DAY:
            msg = f"{name} must be a day from {FIRST_DAY} to {LAST_DAY}"
            raise InvalidSpec(msg, [field_error(["query", name], msg)])
    today = utcnow().date()
    end = end or today + timedelta(days=1)
    start = start or end - timedelta(days=30)
    if not start < end or (end - start).days > MAX_DAYS:
        msg = f"from must come before to, at most {MAX_DAYS} days apart"
        raise InvalidSpec(msg, [field_error(["query", "from"], msg)])
    groups: list[usage.GroupBy] = list(dict.fromkeys(group_by or ["team"]))
    team = None if principal.at_least("admin") else principal.team
    csv_asked = "text/csv" in accept
    after, known_rows = _after(cursor, groups) if cursor and not csv_asked else (None, None)
    with services.db.read() as session:
        if "day" in groups and not csv_asked:
            page = usage.page_by_day(
                session, start, end, groups, limit, after, team, known_rows=known_rows
            )
        else:
            rows = usage.report(session, start, end, groups, team)
    if csv_asked:
        out = io.StringIO()
        writer = csv.DictWriter(out, [*groups, "accelerator_hours", "accelerator_seconds", "runs"])
        writer.writeheader()
        writer.writerows(rows)
        return Response(out.getvalue(), media_type="text/csv")
    if "day" not in groups:  # a few hundred groups at most: ranked whole, then cut
        offset = int(after[0]) if after else 0  # ranked afresh: counted afresh
        shown = rows[offset : offset + limit]
        more = offset + limit < len(rows)
        seconds = sum(r["accelerator_seconds"] for r in rows)
        page = usage.Page(shown, len(rows), seconds, (offset + limit,) if more else None)
    doc = {
        "start": start,
        "end": end,
        "group_by": groups,
        "rows": page.rows,
        "total_rows": page.total_rows,
        "total_accelerator_hours": round(page.total_seconds / 3600, 6),
        "next_cursor": _cursor(page.last, groups, page.total_rows) if page.last else None,
    }
    return json_response(doc)


def _cursor(last: tuple[Any, ...], groups: list[usage.GroupBy], total_rows: int) -> str:
    """Opaque to the caller: the last row's key (or the next offset), the grouping it is of (a
    cursor of another report is refused rather than misread) and the report's rows as the
    first page counted them (a later page need not count them again)."""
    key = [v.isoformat() if isinstance(v, date) else v for v in last]
    return base64.urlsafe_b64encode(json.dumps([groups, key, total_rows]).encode()).decode()


def _after(cursor: str, groups: list[usage.GroupBy]) -> tuple[tuple[Any, ...], int]:
    """The key a cursor continues after, and the report's rows."""
    msg = "not a next_cursor of this report"
    try:
        of, key, total_rows = json.loads(base64.urlsafe_b64decode(cursor.encode()))
        if of != groups or not isinstance(total_rows, int) or total_rows < 0:
            raise ValueError(msg)
        if "day" not in groups:
            (offset,) = key
            if not isinstance(offset, int) or offset < 0:
                raise ValueError(msg)
            return (offset,), total_rows
        order = usage.order_of(groups)
        if len(key) != len(order) or not all(isinstance(v, str) for v in key):
            raise ValueError(msg)
        return (date.fromisoformat(key[0]), *key[1:]), total_rows
    except (ValueError, TypeError, binascii.Error):
        raise InvalidSpec(msg, [field_error(["query", "cursor"], msg)]) from None
