"""Accelerator usage: accelerator-seconds from a run's allocation (submitted to ended), like
Determined's slot-hours, kept per UTC day and month, team, user, recipe and accelerator.

A run adds its allocation when it ends, split at midnights (``accrue``, in the transaction of
its last status change); runs still allocated are counted up to now when a report is read, so
a report is exact at any moment without a periodic job. A report reads month rows for the
whole months of its window and, for a month in part, its days inside or the month less its days
outside, whichever are fewer (day rows throughout when grouped by day), whatever the number of
runs. Each row is kept twice: per user and recipe (``UsageTotal``) and summed over them
(``UsageTeamTotal``), which a report by team, day or accelerator reads. A report by day is
also read a page at a time (``page_by_day``): sorted and cut by the database, in day order.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from typing import Any, Literal

from sqlalchemy import and_, bindparam, case, func, inspect, or_, select, tuple_
from sqlalchemy.engine import Connection
from sqlalchemy.orm import Mapper, Session

from service.clock import utcnow
from service.scheduling.fair_share import decay_over
from service.store.dialect import dialect_insert
from service.store.models import Run, UsageTeamTotal, UsageTotal
from service.store.status import ACTIVE

GroupBy = Literal["team", "user", "recipe", "day", "accelerator"]
GROUPS: tuple[GroupBy, ...] = ("team", "user", "recipe", "day", "accelerator")
UNKNOWN_USER = "(unknown)"


def _days(start: datetime, end: datetime) -> Iterator[tuple[date, float]]:
    """Seconds of [start, end) in each UTC day it touches."""
    at = start.astimezone(UTC)
    end = end.astimezone(UTC)
    while at < end:
        midnight = datetime.combine(at.date() + timedelta(days=1), time(), UTC)
        upto = min(midnight, end)
        yield at.date(), (upto - at).total_seconds()
        at = upto


def _accelerators(shape: dict[str, Any] | None) -> tuple[str, int]:
    shape = shape or {}
    return str(shape.get("accelerator", "NPU")), int(shape.get("accelerators", 0))


def _month(day: date) -> date:
    return day.replace(day=1)


def _next_month(day: date) -> date:
    return (day.replace(day=28) + timedelta(days=4)).replace(day=1)


# The tables a run's usage is kept in, with the columns of each (but period and start).
_TABLES: tuple[tuple[type[UsageTotal] | type[UsageTeamTotal], tuple[str, ...]], ...] = (
    (UsageTotal, ("team", "user", "recipe", "accelerator")),
    (UsageTeamTotal, ("team", "accelerator")),
)
# Groups the per-team table can answer.
_BY_TEAM = {"team", "day", "accelerator"}
Table = type[UsageTotal] | type[UsageTeamTotal]


def _group(run: Run | Any, kind: str) -> dict[str, Any]:
    """The columns a run's usage is kept under (but the day)."""
    return {
        "team": run.team,
        "user": run.created_by or UNKNOWN_USER,
        "recipe": run.recipe,
        "accelerator": kind,
    }


def accrue(session: Session, run: Run, ended_at: datetime) -> None:
    """Add ``run``'s allocation, from its submission to ``ended_at``, to the day and month
    rows."""
    kind, count = _accelerators(run.launch.get("shape"))
    if run.submitted_at is None or count == 0:
        return
    key = _group(run, kind)
    cells: dict[tuple[str, date], list[float]] = defaultdict(lambda: [0.0, 0])
    for i, (day, seconds) in enumerate(_days(run.submitted_at, ended_at)):
        for cell in (("d", day), ("m", _month(day))):
            cells[cell][0] += count * seconds
            cells[cell][1] += 1 if i == 0 else 0
    insert = dialect_insert(session)
    for table, columns in _TABLES:
        for (period, start), (seconds, runs) in cells.items():
            stmt = insert(table).values(
                period=period,
                start=start,
                **{c: key[c] for c in columns},
                accelerator_seconds=seconds,
                runs=runs,
            )
            session.execute(
                stmt.on_conflict_do_update(
                    index_elements=["period", "start", *columns],
                    set_={
                        "accelerator_seconds": table.accelerator_seconds
                        + stmt.excluded.accelerator_seconds,
                        "runs": table.runs + stmt.excluded.runs,
                    },
                )
            )


def _rows_within(table: Table, start: date, end: date, by_day: bool) -> tuple[Any, Any]:
    """Which rows make up [start, end), and which of them count negatively: months wholly
    inside it, and for a month it covers in part, the days inside it or, when fewer, the
    month less the days outside it (a year to today reads 12 months and 2 days' rows, not 30
    days' rows for the month it begins in)."""
    first_month = start if start.day == 1 else _next_month(start)
    last_month = _month(end)
    if by_day or first_month >= last_month:
        return and_(table.period == "d", table.start >= start, table.start < end), None

    def days(lo: date, hi: date) -> Any:
        return and_(table.period == "d", table.start >= lo, table.start < hi)

    plus = [and_(table.period == "m", table.start >= first_month, table.start < last_month)]
    minus: list[Any] = []

    def in_part(month: date, lo: date, hi: date) -> None:
        """``month`` covered in part, by [lo, hi): its days, or the month less the others."""
        outside = [(a, b) for a, b in ((month, lo), (hi, _next_month(month))) if a < b]
        if (hi - lo).days > sum((b - a).days for a, b in outside):
            plus.append(and_(table.period == "m", table.start == month))
            minus.extend(days(a, b) for a, b in outside)
        else:
            plus.append(days(lo, hi))

    if start < first_month:
        in_part(_month(start), start, first_month)
    if last_month < end:
        in_part(last_month, last_month, end)
    return or_(*plus, *minus), or_(*minus) if minus else None


def report(
    session: Session,
    start: date,
    end: date,
    group_by: Sequence[GroupBy],
    team: str | None = None,
    now: datetime | None = None,
) -> list[dict[str, Any]]:
    """Accelerator-seconds and runs (submitted in the window) in the UTC days [start, end),
    per group (only ``team``'s when given), largest first; runs still allocated count up to
    ``now``."""
    table: Table = UsageTeamTotal if _BY_TEAM.issuperset(group_by) else UsageTotal
    columns = [table.start if g == "day" else getattr(table, g) for g in group_by]
    rows_in, less = _rows_within(table, start, end, "day" in group_by)
    signed: list[Any] = [table.accelerator_seconds, table.runs]
    if less is not None:
        signed = [case((less, -c), else_=c) for c in signed]
    query = select(*columns, *map(func.sum, signed)).where(rows_in).group_by(*columns)
    if team is not None:
        query = query.where(table.team == team)
    # Core rows (no ORM loading): a year by team and day is 36,500 of them.
    n = len(group_by)
    totals: dict[tuple[Any, ...], list[float]] = {
        row[:n]: [row[n] or 0.0, row[n + 1] or 0] for row in session.connection().execute(query)
    }
    for key, seconds, counted in _live(session, start, end, group_by, team, now):
        cell = totals.setdefault(key, [0.0, 0])
        cell[0] += seconds
        cell[1] += counted
    ranked = sorted(totals.items(), key=lambda kv: -kv[1][0])
    return [_row(group_by, key, seconds, runs) for key, (seconds, runs) in ranked]


@dataclass(frozen=True)
class Page:
    """One page of a report by day, and what the whole report holds."""

    rows: list[dict[str, Any]]
    total_rows: int  # stored groups and running runs' groups not stored yet
    total_seconds: float
    last: tuple[Any, ...] | None  # the key of the page's last row when more follow


def order_of(group_by: Sequence[GroupBy]) -> list[GroupBy]:
    """The order of a report by day: by day, then by the other groups as given."""
    return ["day", *(g for g in group_by if g != "day")]


def page_by_day(
    session: Session,
    start: date,
    end: date,
    group_by: Sequence[GroupBy],
    limit: int,
    after: tuple[Any, ...] | None = None,
    team: str | None = None,
    now: datetime | None = None,
    known_rows: int | None = None,
) -> Page:
    """A page of ``limit`` rows of a report grouped by day (and more), in ``order_of`` order,
    after the key ``after`` (a previous page's ``last``): the database sorts and cuts the
    page, so a year of 100 teams costs a page's rows, not 36,500. The totals are the whole
    report's: its rows counted unless ``known_rows`` (a first page's count) says; running runs
    count up to ``now`` as in ``report``."""
    assert "day" in group_by
    table: Table = UsageTeamTotal if _BY_TEAM.issuperset(group_by) else UsageTotal
    order = order_of(group_by)
    columns = [table.start if g == "day" else getattr(table, g) for g in order]
    rows_in, _ = _rows_within(table, start, end, by_day=True)
    where = [rows_in] if team is None else [rows_in, table.team == team]
    summed: list[Any] = [func.sum(table.accelerator_seconds), func.sum(table.runs)]
    grouped = select(*columns, *summed).where(*where).group_by(*columns)
    conn = session.connection()
    # The totals without summing each row: the groups counted from the key alone (the primary
    # key's index covers it), the seconds from month rows where whole months are in the window.
    stored_rows = 0 if known_rows is not None else _groups(conn, table, columns, where)
    months, less = _rows_within(table, start, end, by_day=False)
    column = table.accelerator_seconds
    signed = column if less is None else case((less, -column), else_=column)
    in_months = [months] if team is None else [months, table.team == team]
    total_seconds = float(conn.execute(select(func.sum(signed)).where(*in_months)).scalar() or 0)
    # Running runs, keyed in the page's order; those on days and groups with no stored row
    # yet are rows of their own.
    live: dict[tuple[Any, ...], list[float]] = {}
    for key, seconds, counted in _live(session, start, end, order, team, now):
        cell = live.setdefault(key, [0.0, 0])
        cell[0] += seconds
        cell[1] += counted
    stored_live: set[tuple[Any, ...]] = set()
    if live:  # their days only (inside the window: ``_live`` clips to it)
        on_days = [table.period == "d", table.start.in_({k[0] for k in live})]
        if team is not None:
            on_days.append(table.team == team)
        stored_live = {
            tuple(r) for r in conn.execute(select(*columns).where(*on_days).group_by(*columns))
        }
    total_rows = stored_rows + len(live.keys() - stored_live) if known_rows is None else known_rows
    total_seconds += sum(c[0] for c in live.values())
    if after is not None:
        bound = [bindparam(None, v, type_=c.type) for c, v in zip(columns, after, strict=True)]
        grouped = grouped.where(tuple_(*columns) > tuple_(*bound))
    fetched = {
        tuple(r[: len(order)]): [r[-2] or 0.0, r[-1] or 0]
        for r in conn.execute(grouped.order_by(*columns).limit(limit + 1))
    }
    merged = dict(fetched)
    for key, (so_far, started) in live.items():
        if (after is not None and key <= after) or (key in stored_live and key not in fetched):
            continue  # on an earlier page, or on a later one with its stored row
        cell = merged.setdefault(key, [0.0, 0])
        cell[0] += so_far
        cell[1] += started
    keys = sorted(merged)
    shown = keys[:limit]
    return Page(
        [_row(order, k, *merged[k]) for k in shown],
        total_rows,
        total_seconds,
        shown[-1] if len(keys) > limit else None,
    )


def _groups(conn: Connection, table: Table, columns: list[Any], where: list[Any]) -> int:
    """How many groups of ``columns`` the rows ``where`` make: the rows themselves when each
    key column left out of the groups holds one value there (one accelerator kind, as most
    clusters have: one pass over the key's index, no hashing), else counted distinct."""
    grouped = {c.key for c in columns}
    mapper: Mapper[Any] = inspect(table)
    left = [c for c in mapper.primary_key if c.key not in grouped | {"period"}]
    spans = [f(c) for c in left for f in (func.min, func.max)]
    rows, *ends = conn.execute(select(func.count(), *spans).where(*where)).one()
    if all(lo == hi for lo, hi in zip(ends[::2], ends[1::2], strict=True)):
        return int(rows)
    distinct = select(*columns).where(*where).distinct().subquery()
    return int(conn.execute(select(func.count()).select_from(distinct)).scalar_one())


def _row(
    group_by: Sequence[GroupBy], key: tuple[Any, ...], seconds: float, runs: float
) -> dict[str, Any]:
    row = dict(zip(group_by, key, strict=True))
    if "day" in row:
        row["day"] = row["day"].isoformat()
    row["accelerator_seconds"] = round(seconds, 3)
    row["accelerator_hours"] = round(seconds / 3600, 6)
    row["runs"] = int(runs)
    return row


# What the usage of a run not yet ended is counted from (no ORM object: a report reads them all).
_LIVE = (
    Run.team,
    Run.created_by,
    Run.recipe,
    Run.launch["shape"].label("shape"),
    Run.submitted_at,
)


def _live(
    session: Session,
    start: date,
    end: date,
    group_by: Sequence[GroupBy],
    team: str | None,
    now: datetime | None,
) -> Iterator[tuple[tuple[Any, ...], float, int]]:
    """The allocation so far of runs that have not ended, per group and day."""
    now = now or utcnow()
    query = select(*_LIVE).where(Run.status.in_(ACTIVE), Run.submitted_at.is_not(None))
    if team is not None:
        query = query.where(Run.team == team)
    window_start = datetime.combine(start, time(), UTC)
    window_end = datetime.combine(end, time(), UTC)
    for run in session.execute(query):
        kind, count = _accelerators(run.shape)
        assert run.submitted_at is not None
        submitted_on = run.submitted_at.astimezone(UTC).date()
        for day, seconds in _days(max(run.submitted_at, window_start), min(now, window_end)):
            fields = _group(run, kind) | {"day": day}
            yield tuple(fields[g] for g in group_by), count * seconds, int(day == submitted_on)


def lifetime(session: Session, now: datetime | None = None) -> dict[tuple[str, str], float]:
    """Accelerator-seconds ever allocated per team and accelerator, running runs up to ``now``:
    a counter (it only grows; a run that ends moves its live count into the month rows)."""
    now = now or utcnow()
    totals: dict[tuple[str, str], float] = defaultdict(float)
    summed = (
        select(
            UsageTeamTotal.team,
            UsageTeamTotal.accelerator,
            func.sum(UsageTeamTotal.accelerator_seconds),
        )
        .where(UsageTeamTotal.period == "m")
        .group_by(UsageTeamTotal.team, UsageTeamTotal.accelerator)
    )
    for team, kind, seconds in session.execute(summed):
        totals[team, kind] += seconds or 0.0
    active = select(*_LIVE).where(Run.status.in_(ACTIVE), Run.submitted_at.is_not(None))
    for run in session.execute(active):
        kind, count = _accelerators(run.shape)
        assert run.submitted_at is not None
        totals[run.team, kind] += count * max(0.0, (now - run.submitted_at).total_seconds())
    return dict(totals)


def recent(session: Session, now: datetime, half_life_s: float) -> dict[str, float]:
    """Per team, accelerator-seconds each weighted by ``2 ** -(age / half_life_s)``: ended runs
    from the day rows of the last ten half-lives (a day's seconds taken as spread evenly over
    it, today's up to ``now``), runs still allocated exactly, from their submission to ``now``.
    Admission's fair share reads it (``scheduling.fair_share``)."""
    if half_life_s <= 0:
        return {}
    at = now.timestamp()
    since = (now - timedelta(seconds=10 * half_life_s)).date()
    totals: dict[str, float] = defaultdict(float)
    days = (
        select(
            UsageTeamTotal.team, UsageTeamTotal.start, func.sum(UsageTeamTotal.accelerator_seconds)
        )
        .where(UsageTeamTotal.period == "d", UsageTeamTotal.start >= since)
        .group_by(UsageTeamTotal.team, UsageTeamTotal.start)
    )
    for team, day, seconds in session.connection().execute(days):
        begin = datetime.combine(day, time(), UTC).timestamp()
        end = min(at, begin + 86400.0)
        totals[team] += (seconds or 0.0) * decay_over(begin, end, at, half_life_s)
    active = select(*_LIVE).where(Run.status.in_(ACTIVE), Run.submitted_at.is_not(None))
    for run in session.execute(active):
        _, count = _accelerators(run.shape)
        assert run.submitted_at is not None
        start = min(at, run.submitted_at.timestamp())
        totals[run.team] += count * (at - start) * decay_over(start, at, at, half_life_s)
    return dict(totals)
