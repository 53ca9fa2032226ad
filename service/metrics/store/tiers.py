"""Downsampling: history tiers of bucket widths 2**level steps, each bucket a summary of one
key's points (count, min, max, last step and value), kept as points arrive and read merged."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy import case, func, insert, select, tuple_
from sqlalchemy.dialects import sqlite
from sqlalchemy.orm import Session

from service.metrics.store.rows import BUCKETS, POINTS, Point, read_value
from service.store.models import MetricBucket

# History tiers: bucket widths 2**level steps, 4x apart, so a downsampled read merges at most
# two stored buckets per answered one (the width answered is a power of two, see ``width``).
LEVELS = (4, 6, 8, 10, 12)


# A summary of one key's points in one bucket, as a list for speed:
# [count, min, max (both ignoring NaN, None when none), last step, value at the last step].
Summary = list[Any]


def _absorb(into: Summary, other: Summary) -> None:
    into[0] += other[0]
    if other[1] is not None and (into[1] is None or other[1] < into[1]):
        into[1] = other[1]
    if other[2] is not None and (into[2] is None or other[2] > into[2]):
        into[2] = other[2]
    if other[3] > into[3]:
        into[3], into[4] = other[3], other[4]


def _fold(items: Iterable[tuple[int, int, Summary]], shift: int) -> dict[tuple[int, int], Summary]:
    """Summaries per (key id, bucket >> shift)."""
    out: dict[tuple[int, int], Summary] = {}
    for key, bucket, summary in items:
        seen = out.get((key, bucket >> shift))
        if seen is None:
            out[(key, bucket >> shift)] = list(summary)
        else:
            _absorb(seen, summary)
    return out


def as_point(summary: Summary) -> Point:
    return Point(summary[3], read_value(summary[4]), read_value(summary[1]), read_value(summary[2]))


def keep_buckets(session: Session, new: Sequence[Any]) -> None:
    """SQLite: the tiers take in the new points."""
    # Each level folds the one below it: the points are walked once.
    level = LEVELS[0]
    tier = _fold(((k, s, [1, v, v, s, v]) for k, s, v in new), level)
    rows = []
    for next_level in (*LEVELS[1:], None):
        rows += [
            {
                "key_id": key_id,
                "level": level,
                "bucket": bucket,
                "count": n,
                "min": lo,
                "max": hi,
                "last_step": last_step,
                "last_value": last_value,
            }
            for (key_id, bucket), (n, lo, hi, last_step, last_value) in tier.items()
        ]
        if next_level is not None:
            tier = _fold(((k, b, s) for (k, b), s in tier.items()), next_level - level)
            level = next_level
    stmt = sqlite.insert(BUCKETS)
    ex, old = stmt.excluded, BUCKETS.c
    newer = ex.last_step > old.last_step
    session.execute(
        stmt.on_conflict_do_update(
            index_elements=["key_id", "level", "bucket"],
            set_={
                "count": old.count + ex.count,
                "min": _lowest(old.min, ex.min, lowest=True),
                "max": _lowest(old.max, ex.max, lowest=False),
                "last_step": case((newer, ex.last_step), else_=old.last_step),
                "last_value": case((newer, ex.last_value), else_=old.last_value),
            },
        ),
        rows,
    )


def _lowest(a: Any, b: Any, lowest: bool) -> Any:
    """SQLite: ``a`` or ``b``, the lower (higher) ignoring NULL (its scalar min/max give NULL
    when either is NULL)."""
    return func.coalesce((func.min if lowest else func.max)(a, b), a, b)


def width(lo: int, hi: int, max_points: int) -> int:
    """The smallest power of two whose aligned buckets (``step // width``) cover ``[lo, hi]`` in
    at most ``max_points`` buckets; 1 means every point."""
    w = 1
    while hi // w - lo // w + 1 > max_points:
        w *= 2
    return w


def tier_rows(session: Session, keys: Sequence[int], level: int, lo: int, hi: int) -> Iterable[Any]:
    """(key id, bucket, *summary) of ``keys`` in one tier's buckets ``[lo, hi]``, by key and bucket
    (rows streamed from the cursor: a third of the cost of a list of them, read once anyway)."""
    return session.connection().execute(  # Core rows: no ORM cost per row
        select(
            MetricBucket.key_id,
            MetricBucket.bucket,
            MetricBucket.count,
            MetricBucket.min,
            MetricBucket.max,
            MetricBucket.last_step,
            MetricBucket.last_value,
        )
        .where(
            MetricBucket.key_id.in_(keys),
            MetricBucket.level == level,
            MetricBucket.bucket.between(lo, hi),
        )
        .order_by(MetricBucket.key_id, MetricBucket.bucket)
    )


def merge_into(buckets: dict[int, Summary], bucket: int, summary: Summary) -> None:
    seen = buckets.get(bucket)
    if seen is None:
        buckets[bucket] = summary
    else:
        _absorb(seen, summary)


def rebuild(session: Session, run_id: str, level: int, bucket: int, lo: int, hi: int) -> None:
    """One tier's bucket of every key of the run, from its points in ``[lo, hi)``."""
    pts = POINTS.c
    rows = session.execute(
        select(
            pts.key_id, func.count(), func.min(pts.value), func.max(pts.value), func.max(pts.step)
        )
        .where(pts.run_id == run_id, pts.step >= lo, pts.step < hi)
        .group_by(pts.key_id)
    ).all()
    if not rows:
        return
    last = dict(
        session.execute(
            select(pts.key_id, pts.value).where(
                tuple_(pts.key_id, pts.step).in_([(k, s) for k, _, _, _, s in rows])
            )
        )
        .tuples()
        .all()
    )
    session.execute(
        insert(BUCKETS),
        [
            {
                "key_id": k,
                "level": level,
                "bucket": bucket,
                "count": n,
                "min": lo_v,
                "max": hi_v,
                "last_step": s,
                "last_value": last.get(k),
            }
            for k, n, lo_v, hi_v, s in rows
        ],
    )
