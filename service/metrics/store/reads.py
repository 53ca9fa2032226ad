"""Reads of a run's metrics: the latest values (the run's page and lists), the keys, the
first, most recent and highest points, a series downsampled to a width, and the points past a log
offset (live streams)."""

from __future__ import annotations

import sys
from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy import bindparam, or_, select
from sqlalchemy.orm import Session

from service.metrics.store.rows import Point, read_value
from service.metrics.store.tiers import LEVELS, Summary, as_point, merge_into, tier_rows, width
from service.store.latest import LATEST_OF_RUN
from service.store.models import MetricKey, MetricPoint

FINITE = sys.float_info.max  # ±inf is stored as itself
_LATEST_OF_RUNS = select(MetricKey.run_id, MetricKey.key, MetricKey.step, MetricKey.value).where(
    MetricKey.run_id.in_(bindparam("run_ids", expanding=True)),
    MetricKey.key.in_(bindparam("keys", expanding=True)),
)


def latest(session: Session, run_id: str) -> dict[str, tuple[int, float]]:
    """Key -> (step, value) at the newest step that key was logged, for the keys users watch."""
    rows = session.connection().execute(LATEST_OF_RUN, {"run_id": run_id})
    return {key: (step, read_value(value)) for key, step, value in rows}


def latest_every(session: Session, run_id: str) -> dict[str, tuple[int, float]]:
    """Key -> (step, value) at the newest step that key was logged, for every key, sorted."""
    rows = session.execute(
        select(MetricKey.key, MetricKey.step, MetricKey.value)
        .where(MetricKey.run_id == run_id)
        .order_by(MetricKey.key)
    )
    return {key: (step, read_value(value)) for key, step, value in rows}


def latest_of_runs(
    session: Session, run_ids: Sequence[str], keys: Sequence[str]
) -> dict[str, dict[str, tuple[int, float]]]:
    """Run -> key -> (step, value) at the newest step, for a page of runs in one query."""
    if not run_ids:
        return {}
    params = {"run_ids": list(run_ids), "keys": list(keys)}
    out: dict[str, dict[str, tuple[int, float]]] = {}
    for run_id, key, step, value in session.connection().execute(_LATEST_OF_RUNS, params):
        out.setdefault(run_id, {})[key] = (step, read_value(value))
    return out


def keys_of(session: Session, run_id: str) -> Sequence[str]:
    """A run's keys, sorted (one row each in the latest table)."""
    return session.scalars(
        select(MetricKey.key).where(MetricKey.run_id == run_id).order_by(MetricKey.key)
    ).all()


def recent(session: Session, run_id: str, key: str, limit: int) -> list[tuple[int, float]]:
    """The newest ``limit`` (step, value) pairs of one key, oldest first."""
    key_id = select(MetricKey.id).where(MetricKey.run_id == run_id, MetricKey.key == key)
    rows = session.execute(
        select(MetricPoint.step, MetricPoint.value)
        .where(MetricPoint.key_id == key_id.scalar_subquery())
        .order_by(MetricPoint.step.desc())
        .limit(limit)
    ).all()
    return [(step, read_value(value)) for step, value in reversed(rows)]


def highest(session: Session, run_id: str, key: str) -> tuple[int, float] | None:
    """The (step, value) of one key's highest finite value over the whole run (its first step
    of that value), None if it has none."""
    key_id = select(MetricKey.id).where(MetricKey.run_id == run_id, MetricKey.key == key)
    row = session.execute(
        select(MetricPoint.step, MetricPoint.value)
        .where(
            MetricPoint.key_id == key_id.scalar_subquery(),
            MetricPoint.value.between(-FINITE, FINITE),  # neither NULL (NaN) nor ±inf
        )
        .order_by(MetricPoint.value.desc(), MetricPoint.step)
        .limit(1)
    ).first()
    return None if row is None else (row[0], read_value(row[1]))


def first(session: Session, run_id: str, key: str, limit: int) -> list[tuple[int, float]]:
    """The oldest ``limit`` (step, value) pairs of one key, oldest first."""
    key_id = select(MetricKey.id).where(MetricKey.run_id == run_id, MetricKey.key == key)
    rows = session.execute(
        select(MetricPoint.step, MetricPoint.value)
        .where(MetricPoint.key_id == key_id.scalar_subquery())
        .order_by(MetricPoint.step)
        .limit(limit)
    ).all()
    return [(step, read_value(value)) for step, value in rows]


def series(
    session: Session,
    run_id: str,
    keys: Sequence[str] | None,
    max_points: int,
    from_step: int | None = None,
    to_step: int | None = None,
) -> dict[str, list[Point]]:
    """History of ``keys`` (all the run's keys when None), one answer for all of them: steps
    ``[from_step, to_step]`` in aligned buckets of ``width`` steps, each giving its last step and
    value with its min and max (NaN ignored by min/max); width 1 gives the points themselves.

    Buckets come from the coarsest tier that divides the width (at most two stored buckets per
    answered one), or from the points below the finest tier; a bucket cut by ``from_step`` or
    ``to_step`` is summarised from its points in the range."""
    spans = session.execute(
        select(MetricKey.key, MetricKey.id, MetricKey.first_step, MetricKey.step)
        .where(MetricKey.run_id == run_id, *([MetricKey.key.in_(keys)] if keys else []))
        .order_by(MetricKey.key)
    ).all()
    out: dict[str, list[Point]] = {k: [] for k in (keys or [k for k, *_ in spans])}
    if not spans:
        return out
    first, last = min(s[2] for s in spans), max(s[3] for s in spans)
    lo = first if from_step is None else max(from_step, first)
    hi = last if to_step is None else min(to_step, last)
    if lo > hi:
        return out
    names = {key_id: k for k, key_id, _, _ in spans}
    w = width(lo, hi, max_points)
    if w == 1:
        for key_id, step, value in _points(session, list(names), [(lo, hi)]):
            point = read_value(value)
            out[names[key_id]].append(Point(step, point, point, point))
        return out
    summaries: dict[int, dict[int, Summary]] = {key_id: {} for key_id in names}
    level = max((lv for lv in LEVELS if 1 << lv <= w), default=None)
    b_lo, b_hi = lo // w, hi // w
    from_points = []
    if level is None:
        from_points.append((lo, hi))
    else:
        # Buckets cut by the range come from points; the rest from the tier.
        if lo > first and lo % w:
            from_points.append((lo, min(hi, (b_lo + 1) * w - 1)))
            b_lo += 1
        if hi < last and (hi + 1) % w and b_hi >= b_lo:
            from_points.append((max(lo, b_hi * w), hi))
            b_hi -= 1
        if b_lo <= b_hi:
            shift = w.bit_length() - 1 - level
            for key_id, bucket, *summary in tier_rows(
                session, list(names), level, b_lo << shift, ((b_hi + 1) << shift) - 1
            ):
                merge_into(summaries[key_id], bucket >> shift, summary)
    if from_points:
        for key_id, step, value in _points(session, list(names), from_points):
            merge_into(summaries[key_id], step // w, [1, value, value, step, value])
    for key_id, buckets in summaries.items():
        out[names[key_id]] = [as_point(buckets[b]) for b in sorted(buckets)]
    return out


def _points(
    session: Session, keys: Sequence[int], ranges: Sequence[tuple[int, int]]
) -> Iterable[Any]:
    """(key id, step, value) of ``keys`` in the step ranges, by key and step (streamed, as
    above)."""
    return session.connection().execute(
        select(MetricPoint.key_id, MetricPoint.step, MetricPoint.value)
        .where(
            MetricPoint.key_id.in_(keys),
            or_(*(MetricPoint.step.between(a, b) for a, b in ranges)),
        )
        .order_by(MetricPoint.key_id, MetricPoint.step)
    )


# Stored points past a log offset (parameters ``run_id``, ``offset``, ``limit``), in line order.
LINES_AFTER = (
    select(MetricPoint.log_offset, MetricPoint.step, MetricKey.key, MetricPoint.value)
    .join(MetricKey, MetricKey.id == MetricPoint.key_id)
    .where(MetricPoint.run_id == bindparam("run_id"), MetricPoint.log_offset > bindparam("offset"))
    .order_by(MetricPoint.log_offset, MetricPoint.step, MetricKey.key)
    .limit(bindparam("limit"))
)
# How many points one read of ``LINES_AFTER`` takes at most.
LINES_LIMIT = 5000


def lines_after(
    session: Session, run_id: str, offset: int, limit: int = LINES_LIMIT
) -> list[tuple[int, int, dict[str, float]]]:
    """Stored points past a log offset, regrouped as ``(end offset, step, values)`` per line."""
    params = {"run_id": run_id, "offset": offset, "limit": limit}
    return as_lines(session.execute(LINES_AFTER, params).all(), limit)


def as_lines(rows: Sequence[Any], limit: int) -> list[tuple[int, int, dict[str, float]]]:
    """The rows of ``LINES_AFTER`` (at most ``limit``) as ``(end offset, step, values)`` per
    line."""
    grouped: dict[tuple[int, int], dict[str, float]] = {}
    for off, step, key, value in rows:
        grouped.setdefault((off, step), {})[key] = read_value(value)
    if len(rows) == limit and grouped:
        # The last line may be cut by the limit: leave it for the next read.
        grouped.pop(next(reversed(grouped)))
    return [(off, step, values) for (off, step), values in grouped.items()]
