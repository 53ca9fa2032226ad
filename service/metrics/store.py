"""Metric points in the database: idempotent batch writes, latest values, downsampled history.

NaN is stored as NULL (SQLite turns NaN into NULL anyway, so both backends agree); ``±inf`` is
stored as itself. Reads hand NULL back as ``nan``. Writes flush, never commit.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import and_, func, or_, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from service.metrics.parse import MetricLine
from service.store.models import MetricPoint

# Keys shown as ``metrics.latest`` on a run: reward, validation, async health, staleness.
LATEST_KEYS = (
    "critic/score/mean",
    "critic/score/max",
    "critic/score/min",
    "critic/rewards/mean",
    "fully_async/trainer/idle_ratio",
    "fully_async/rollouter/idle_ratio",
    "fully_async/partial/partial_ratio",
    "fully_async/count/stale_trajectory_processed",
    "fully_async/count/current_param_version",
    "training/global_step",
)
LATEST_PATTERNS = ("val-core/%/acc/mean@%",)
# What the columns hold (``metric_points.key``, ``.step``): anything past them is dropped.
KEY_MAX = 200
STEP_MAX = 2**63 - 1
LONG_KEY = "metric points dropped: a key is longer than"
BIG_STEP = "metric line dropped: its step is above"


@dataclass(frozen=True)
class Point:
    step: int
    value: float
    min: float
    max: float


def _stored(value: float) -> float | None:
    return None if math.isnan(value) else value


def _read(value: float | None) -> float:
    return math.nan if value is None else value


def dialect_insert(session: Session) -> Any:
    """The backend's INSERT (it has ``on_conflict_do_nothing`` on SQLite and PostgreSQL)."""
    dialect = session.get_bind().dialect.name
    return postgresql.insert if dialect == "postgresql" else sqlite.insert


def storable(
    lines: Iterable[tuple[int, MetricLine]],
) -> tuple[list[tuple[int, MetricLine]], dict[str, str]]:
    """The lines (and values) the columns can hold, and a note per kind of what was dropped,
    keyed by the note's fixed prefix (``LONG_KEY``, ``BIG_STEP``)."""
    kept: list[tuple[int, MetricLine]] = []
    notes: dict[str, str] = {}
    for offset, line in lines:
        if line.step > STEP_MAX:
            notes.setdefault(BIG_STEP, f"{BIG_STEP} {STEP_MAX} (step {str(line.step)[:40]})")
            continue
        values = {k: v for k, v in line.values.items() if len(k) <= KEY_MAX}
        if len(values) < len(line.values):
            key = next(k for k in line.values if len(k) > KEY_MAX)
            notes.setdefault(LONG_KEY, f"{LONG_KEY} {KEY_MAX} characters (e.g. {key[:40]!r}...)")
        if values:
            kept.append((offset, MetricLine(line.step, values)))
    return kept, notes


def add_lines(session: Session, run_id: str, lines: Iterable[tuple[int, MetricLine]]) -> int:
    """Store each ``(end offset, line)``'s values; a (run, key, step) already stored is kept."""
    rows = [
        {
            "run_id": run_id,
            "key": key,
            "step": line.step,
            "value": _stored(value),
            "log_offset": offset,
        }
        for offset, line in lines
        for key, value in line.values.items()
    ]
    if rows:
        stmt = dialect_insert(session)(MetricPoint).on_conflict_do_nothing(
            index_elements=["run_id", "key", "step"]
        )
        session.execute(stmt, rows)  # one compiled statement, sent as multi-row batches
    return len(rows)


def latest(session: Session, run_id: str) -> dict[str, tuple[int, float]]:
    """Key -> (step, value) at the newest step that key was logged, for the keys users watch."""
    newest = (
        select(MetricPoint.key, func.max(MetricPoint.step).label("step"))
        .where(
            MetricPoint.run_id == run_id,
            or_(
                MetricPoint.key.in_(LATEST_KEYS),
                *(MetricPoint.key.like(p) for p in LATEST_PATTERNS),
            ),
        )
        .group_by(MetricPoint.key)
        .subquery()
    )
    rows = session.execute(
        select(MetricPoint.key, MetricPoint.step, MetricPoint.value).join(
            newest,
            and_(
                MetricPoint.run_id == run_id,
                MetricPoint.key == newest.c.key,
                MetricPoint.step == newest.c.step,
            ),
        )
    )
    return {key: (step, _read(value)) for key, step, value in rows}


def latest_of_runs(
    session: Session, run_ids: Sequence[str], keys: Sequence[str]
) -> dict[str, dict[str, tuple[int, float]]]:
    """Run -> key -> (step, value) at the newest step, for a page of runs in one query."""
    if not run_ids:
        return {}
    newest = (
        select(MetricPoint.run_id, MetricPoint.key, func.max(MetricPoint.step).label("step"))
        .where(MetricPoint.run_id.in_(run_ids), MetricPoint.key.in_(keys))
        .group_by(MetricPoint.run_id, MetricPoint.key)
        .subquery()
    )
    rows = session.execute(
        select(MetricPoint.run_id, MetricPoint.key, MetricPoint.step, MetricPoint.value).join(
            newest,
            and_(
                MetricPoint.run_id == newest.c.run_id,
                MetricPoint.key == newest.c.key,
                MetricPoint.step == newest.c.step,
            ),
        )
    )
    out: dict[str, dict[str, tuple[int, float]]] = {}
    for run_id, key, step, value in rows:
        out.setdefault(run_id, {})[key] = (step, _read(value))
    return out


def recent(session: Session, run_id: str, key: str, limit: int) -> list[tuple[int, float]]:
    """The newest ``limit`` (step, value) pairs of one key, oldest first."""
    rows = session.execute(
        select(MetricPoint.step, MetricPoint.value)
        .where(MetricPoint.run_id == run_id, MetricPoint.key == key)
        .order_by(MetricPoint.step.desc())
        .limit(limit)
    ).all()
    return [(step, _read(value)) for step, value in reversed(rows)]


def series(
    session: Session,
    run_id: str,
    key: str,
    max_points: int,
    from_step: int | None = None,
    to_step: int | None = None,
) -> list[Point]:
    """One key's history; above ``max_points`` the steps fall into equal buckets, each giving
    its last step and value with the bucket's min and max (NaN ignored by min/max)."""
    where = [MetricPoint.run_id == run_id, MetricPoint.key == key]
    if from_step is not None:
        where.append(MetricPoint.step >= from_step)
    if to_step is not None:
        where.append(MetricPoint.step <= to_step)
    count, lo, hi = session.execute(
        select(func.count(), func.min(MetricPoint.step), func.max(MetricPoint.step)).where(*where)
    ).one()
    if not count:
        return []
    if count <= max_points:
        rows = session.execute(
            select(MetricPoint.step, MetricPoint.value).where(*where).order_by(MetricPoint.step)
        )
        return [Point(s, _read(v), _read(v), _read(v)) for s, v in rows]
    width = -(-(hi - lo + 1) // max_points)
    bucket = (MetricPoint.step - lo) // width
    ranked = (
        select(
            MetricPoint.step,
            MetricPoint.value,
            func.row_number()
            .over(partition_by=bucket, order_by=MetricPoint.step.desc())
            .label("rank"),
            func.min(MetricPoint.value).over(partition_by=bucket).label("lo"),
            func.max(MetricPoint.value).over(partition_by=bucket).label("hi"),
        )
        .where(*where)
        .subquery()
    )
    # One pass with window functions: each bucket's last row, with the bucket's min and max.
    buckets: Sequence[Any] = session.execute(
        select(ranked.c.step, ranked.c.value, ranked.c.lo, ranked.c.hi)
        .where(ranked.c.rank == 1)
        .order_by(ranked.c.step)
    ).all()
    return [Point(r[0], _read(r[1]), _read(r[2]), _read(r[3])) for r in buckets]


def lines_after(
    session: Session, run_id: str, offset: int, limit: int = 5000
) -> list[tuple[int, int, dict[str, float]]]:
    """Stored points past a log offset, regrouped as ``(end offset, step, values)`` per line."""
    rows = session.execute(
        select(MetricPoint.log_offset, MetricPoint.step, MetricPoint.key, MetricPoint.value)
        .where(MetricPoint.run_id == run_id, MetricPoint.log_offset > offset)
        .order_by(MetricPoint.log_offset, MetricPoint.step, MetricPoint.key)
        .limit(limit)
    ).all()
    grouped: dict[tuple[int, int], dict[str, float]] = {}
    for off, step, key, value in rows:
        grouped.setdefault((off, step), {})[key] = _read(value)
    if len(rows) == limit and grouped:
        # The last line may be cut by the limit: leave it for the next read.
        grouped.pop(next(reversed(grouped)))
    return [(off, step, values) for (off, step), values in grouped.items()]


def keys_of(session: Session, run_id: str) -> Sequence[str]:
    return session.scalars(
        select(MetricPoint.key).where(MetricPoint.run_id == run_id).distinct()
    ).all()
