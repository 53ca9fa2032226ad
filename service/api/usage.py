"""``GET /usage``: accelerator-hours per team, user, recipe, day or accelerator (JSON or CSV)."""

from __future__ import annotations

import csv
import io
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
from service.wire import UsageOut

router = APIRouter(tags=["usage"])

MAX_DAYS = 3 * 366


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
    accept: Annotated[str, Header()] = "application/json",
) -> Any:
    """Accelerator-seconds allocated (submitted to ended; running runs up to now) in the UTC
    days [from, to), default the last 30 days by team. A viewer or member sees its own team's."""
    today = utcnow().date()
    end = end or today + timedelta(days=1)
    start = start or end - timedelta(days=30)
    if not start < end or (end - start).days > MAX_DAYS:
        msg = f"from must come before to, at most {MAX_DAYS} days apart"
        raise InvalidSpec(msg, [field_error(["query", "from"], msg)])
    groups: list[usage.GroupBy] = list(dict.fromkeys(group_by or ["team"]))
    team = None if principal.at_least("admin") else principal.team
    with services.db.read() as session:
        rows = usage.report(session, start, end, groups, team)
    if "text/csv" in accept:
        out = io.StringIO()
        writer = csv.DictWriter(out, [*groups, "accelerator_hours", "accelerator_seconds", "runs"])
        writer.writeheader()
        writer.writerows(rows)
        return Response(out.getvalue(), media_type="text/csv")
    total = round(sum(r["accelerator_seconds"] for r in rows) / 3600, 6)
    # Serialised once (a year by team and day is 36,500 rows): the model documents the shape.
    doc = {"start": start, "end": end, "group_by": groups, "rows": rows}
    return json_response(doc | {"total_accelerator_hours": total})
