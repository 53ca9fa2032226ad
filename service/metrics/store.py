"""Metric points in the database: idempotent batch writes, latest values, history tiers.

NaN is stored as NULL (SQLite turns NaN into NULL anyway, so both backends agree); ``±inf`` is
stored as itself. Reads hand NULL back as ``nan``. Writes flush, never commit.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import ARRAY, FromClause, bindparam, case, cast, func, or_, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from service.metrics.keys import (
    REWARD_KEY,
    REWARD_MAX_KEY,
    REWARD_MIN_KEY,
    STALE_KEY,
    STEP_KEY,
    TRAINER_STEP_KEY,
)
from service.metrics.parse import MetricLine
from service.store.models import MetricBucket, MetricLatest, MetricPoint, RunLog

# Keys shown as ``metrics.latest`` on a run: reward, validation, async health, staleness.
LATEST_KEYS = (
    REWARD_KEY,
    REWARD_MAX_KEY,
    REWARD_MIN_KEY,
    "critic/rewards/mean",
    "fully_async/trainer/idle_ratio",
    "fully_async/rollouter/idle_ratio",
    "fully_async/partial/partial_ratio",
    STALE_KEY,
    STEP_KEY,
    TRAINER_STEP_KEY,
)
LATEST_PATTERNS = ("val-core/%/acc/mean@%",)
# What the columns hold (``metric_points.key``, ``.step``): anything past them is dropped.
KEY_MAX = 200
STEP_MAX = 2**63 - 1
LONG_KEY = "metric points dropped: a key is longer than"
BIG_STEP = "metric line dropped: its step is above"
# What one run may hold (``Limits``): past them, new keys or any points are dropped.
KEYS_FULL = "metric keys dropped: the run holds its limit of"
POINTS_FULL = "metric points dropped: the run holds its limit of"
# Keys per lookup of those a run holds: a statement binds at most 65,535 values (psycopg).
_KEYS_PER_QUERY = 500


@dataclass(slots=True)  # not frozen: a read makes one per answered point, and frozen doubles that
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


@dataclass(frozen=True)
class Limits:
    """What one run may store at most: distinct keys and points (see ``Settings``)."""

    keys: int = 2_000
    points: int = 20_000_000


@dataclass(frozen=True)
class Budget:
    """A run's limits, what it holds (``RunLog.metric_keys``, ``.metric_points``) and which of
    the keys offered it holds already."""

    limits: Limits
    keys: int
    points: int
    known: frozenset[str]


def within(
    lines: Iterable[tuple[int, MetricLine]], budget: Budget
) -> tuple[list[tuple[int, MetricLine]], dict[str, str]]:
    """The lines (and values) the run's budget allows, in order, and a note per kind of what was
    dropped, keyed by its fixed prefix (``KEYS_FULL``, ``POINTS_FULL``). A key the run holds
    is never refused for the key limit; points are counted as offered (a duplicate included)."""
    keys_left = budget.limits.keys - budget.keys
    points_left = budget.limits.points - budget.points
    admitted: set[str] = set()
    kept: list[tuple[int, MetricLine]] = []
    notes: dict[str, str] = {}
    for offset, line in lines:
        values: dict[str, float] = {}
        for key, value in line.values.items():
            if points_left <= 0:
                text = f"{POINTS_FULL} {budget.limits.points} points (from step {line.step})"
                notes.setdefault(POINTS_FULL, text)
                break
            if key not in budget.known and key not in admitted:
                if keys_left <= 0:
                    text = f"{KEYS_FULL} {budget.limits.keys} keys (e.g. {key[:40]!r})"
                    notes.setdefault(KEYS_FULL, text + "; the keys it holds are still stored")
                    continue
                admitted.add(key)
                keys_left -= 1
            values[key] = value
            points_left -= 1
        if values:
            kept.append((offset, MetricLine(line.step, values)))
    return kept, notes


def ingest(
    session: Session, runlog: RunLog, lines: Sequence[tuple[int, MetricLine]], limits: Limits
) -> tuple[int, dict[str, str]]:
    """Store the storable ``lines`` (see ``storable``) that the run's limits allow, counted on
    ``runlog`` (held locked by the caller); the number of new points and a note per kind of
    what the limits dropped."""
    known: set[str] = set()
    # A run at its point limit stores nothing: which keys it holds does not matter.
    full = runlog.metric_points >= limits.points
    names = [] if full else sorted({key for _, line in lines for key in line.values})
    for n in range(0, len(names), _KEYS_PER_QUERY):
        known.update(
            session.scalars(
                select(MetricLatest.key).where(
                    MetricLatest.run_id == runlog.run_id,
                    MetricLatest.key.in_(names[n : n + _KEYS_PER_QUERY]),
                )
            )
        )
    budget = Budget(limits, runlog.metric_keys, runlog.metric_points, frozenset(known))
    kept, notes = within(lines, budget)
    new = _add(session, runlog.run_id, kept)
    runlog.metric_points += len(new)
    runlog.metric_keys += len({key for key, _, _ in new} - known)
    return len(new), notes


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


def _fold(items: Iterable[tuple[str, int, Summary]], shift: int) -> dict[tuple[str, int], Summary]:
    """Summaries per (key, bucket >> shift)."""
    out: dict[tuple[str, int], Summary] = {}
    for key, bucket, summary in items:
        seen = out.get((key, bucket >> shift))
        if seen is None:
            out[(key, bucket >> shift)] = list(summary)
        else:
            _absorb(seen, summary)
    return out


def _point(summary: Summary) -> Point:
    return Point(summary[3], _read(summary[4]), _read(summary[1]), _read(summary[2]))


def _sql_extreme(session: Session, lowest: bool, a: Any, b: Any) -> Any:
    """``a`` or ``b``, the lower (higher) ignoring NULL, in the backend's SQL."""
    if _postgres(session):
        return (func.least if lowest else func.greatest)(a, b)  # these ignore NULL
    # SQLite's scalar min/max give NULL when either is NULL.
    return func.coalesce((func.min if lowest else func.max)(a, b), a, b)


def _postgres(session: Session) -> bool:
    return session.get_bind().dialect.name == "postgresql"


def _bulk_insert(
    session: Session, table: FromClause, rows: list[dict[str, Any]]
) -> tuple[Any, Any]:
    """An INSERT of ``rows`` and its parameters. On PostgreSQL: one statement over one array per
    column (small to send, parsed once); on SQLite: the driver's executemany."""
    insert = dialect_insert(session)
    if not _postgres(session):
        return insert(table), rows
    names = list(rows[0])
    arrays = select(*(func.unnest(cast(bindparam(n), ARRAY(table.c[n].type))) for n in names))
    return insert(table).from_select(names, arrays), {n: [r[n] for r in rows] for n in names}


def add_lines(session: Session, run_id: str, lines: Iterable[tuple[int, MetricLine]]) -> int:
    """Store each ``(end offset, line)``'s values; a (run, key, step) already stored is kept.
    The latest values and history tiers take in exactly the points that were new, in the same
    transaction, so storing the same lines again changes nothing. Returns the points offered.
    Unbounded and uncounted: a followed run's lines go through ``ingest``."""
    lines = list(lines)
    _add(session, run_id, lines)
    return sum(len(line.values) for _, line in lines)


def _add(session: Session, run_id: str, lines: Iterable[tuple[int, MetricLine]]) -> Sequence[Any]:
    """``add_lines``; the (key, step, value) of the points that were new."""
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
    if not rows:
        return []
    stmt, params = _bulk_insert(session, MetricPoint.__table__, rows)
    new = session.execute(
        stmt.on_conflict_do_nothing(index_elements=["run_id", "key", "step"]).returning(
            MetricPoint.key, MetricPoint.step, MetricPoint.value
        ),
        params,
    ).all()
    if new:
        _keep_latest(session, run_id, new)
        _keep_buckets(session, run_id, new)
    return new


def _keep_latest(session: Session, run_id: str, new: Sequence[Any]) -> None:
    latest: dict[str, list[Any]] = {}  # key -> [first step, step, value]
    for key, step, value in new:
        seen = latest.get(key)
        if seen is None:
            latest[key] = [step, step, value]
        else:
            seen[0] = min(seen[0], step)
            if step > seen[1]:
                seen[1:] = [step, value]
    stmt, params = _bulk_insert(
        session,
        MetricLatest.__table__,
        [
            {"run_id": run_id, "key": k, "first_step": f, "step": s, "value": v}
            for k, (f, s, v) in latest.items()
        ],
    )
    ex, old = stmt.excluded, MetricLatest.__table__.c
    newer = ex.step > old.step
    session.execute(
        stmt.on_conflict_do_update(
            index_elements=["run_id", "key"],
            set_={
                "first_step": _sql_extreme(session, True, old.first_step, ex.first_step),
                "step": case((newer, ex.step), else_=old.step),
                "value": case((newer, ex.value), else_=old.value),
            },
        ),
        params,
    )


def _keep_buckets(session: Session, run_id: str, new: Sequence[Any]) -> None:
    # Each level folds the one below it: the points are walked once.
    level = LEVELS[0]
    tier = _fold(((k, s, [1, v, v, s, v]) for k, s, v in new), level)
    rows = []
    for next_level in (*LEVELS[1:], None):
        rows += [
            {
                "run_id": run_id,
                "key": key,
                "level": level,
                "bucket": bucket,
                "count": n,
                "min": lo,
                "max": hi,
                "last_step": last_step,
                "last_value": last_value,
            }
            for (key, bucket), (n, lo, hi, last_step, last_value) in tier.items()
        ]
        if next_level is not None:
            tier = _fold(((k, b, s) for (k, b), s in tier.items()), next_level - level)
            level = next_level
    stmt, params = _bulk_insert(session, MetricBucket.__table__, rows)
    ex, old = stmt.excluded, MetricBucket.__table__.c
    newer = ex.last_step > old.last_step
    session.execute(
        stmt.on_conflict_do_update(
            index_elements=["run_id", "key", "level", "bucket"],
            set_={
                "count": old.count + ex.count,
                "min": _sql_extreme(session, True, old.min, ex.min),
                "max": _sql_extreme(session, False, old.max, ex.max),
                "last_step": case((newer, ex.last_step), else_=old.last_step),
                "last_value": case((newer, ex.last_value), else_=old.last_value),
            },
        ),
        params,
    )


# Built once, run on the session's connection: a run's read binds its parameters only (building
# and keying a statement costs more than running it).
# The keys as bound values, not an expanding IN (which is rendered again at each execution).
# Parameter ``run_id``; columns key, step, value (NULL: NaN).
LATEST_OF_RUN = select(MetricLatest.key, MetricLatest.step, MetricLatest.value).where(
    MetricLatest.run_id == bindparam("run_id"),
    or_(
        MetricLatest.key.in_([bindparam(f"latest_{i}", k) for i, k in enumerate(LATEST_KEYS)]),
        *(MetricLatest.key.like(p) for p in LATEST_PATTERNS),
    ),
)
_LATEST_OF_RUNS = select(
    MetricLatest.run_id, MetricLatest.key, MetricLatest.step, MetricLatest.value
).where(
    MetricLatest.run_id.in_(bindparam("run_ids", expanding=True)),
    MetricLatest.key.in_(bindparam("keys", expanding=True)),
)


def latest(session: Session, run_id: str) -> dict[str, tuple[int, float]]:
    """Key -> (step, value) at the newest step that key was logged, for the keys users watch."""
    rows = session.connection().execute(LATEST_OF_RUN, {"run_id": run_id})
    return {key: (step, _read(value)) for key, step, value in rows}


def latest_every(session: Session, run_id: str) -> dict[str, tuple[int, float]]:
    """Key -> (step, value) at the newest step that key was logged, for every key, sorted."""
    rows = session.execute(
        select(MetricLatest.key, MetricLatest.step, MetricLatest.value)
        .where(MetricLatest.run_id == run_id)
        .order_by(MetricLatest.key)
    )
    return {key: (step, _read(value)) for key, step, value in rows}


def latest_of_runs(
    session: Session, run_ids: Sequence[str], keys: Sequence[str]
) -> dict[str, dict[str, tuple[int, float]]]:
    """Run -> key -> (step, value) at the newest step, for a page of runs in one query."""
    if not run_ids:
        return {}
    params = {"run_ids": list(run_ids), "keys": list(keys)}
    out: dict[str, dict[str, tuple[int, float]]] = {}
    for run_id, key, step, value in session.connection().execute(_LATEST_OF_RUNS, params):
        out.setdefault(run_id, {})[key] = (step, _read(value))
    return out


def keys_of(session: Session, run_id: str) -> Sequence[str]:
    """A run's keys, sorted (one row each in the latest table)."""
    return session.scalars(
        select(MetricLatest.key).where(MetricLatest.run_id == run_id).order_by(MetricLatest.key)
    ).all()


def recent(session: Session, run_id: str, key: str, limit: int) -> list[tuple[int, float]]:
    """The newest ``limit`` (step, value) pairs of one key, oldest first."""
    rows = session.execute(
        select(MetricPoint.step, MetricPoint.value)
        .where(MetricPoint.run_id == run_id, MetricPoint.key == key)
        .order_by(MetricPoint.step.desc())
        .limit(limit)
    ).all()
    return [(step, _read(value)) for step, value in reversed(rows)]


def width(lo: int, hi: int, max_points: int) -> int:
    """The smallest power of two whose aligned buckets (``step // width``) cover ``[lo, hi]`` in
    at most ``max_points`` buckets; 1 means every point."""
    w = 1
    while hi // w - lo // w + 1 > max_points:
        w *= 2
    return w


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
        select(MetricLatest.key, MetricLatest.first_step, MetricLatest.step)
        .where(MetricLatest.run_id == run_id, *([MetricLatest.key.in_(keys)] if keys else []))
        .order_by(MetricLatest.key)
    ).all()
    out: dict[str, list[Point]] = {k: [] for k in (keys or [k for k, _, _ in spans])}
    if not spans:
        return out
    first, last = min(s[1] for s in spans), max(s[2] for s in spans)
    lo = first if from_step is None else max(from_step, first)
    hi = last if to_step is None else min(to_step, last)
    if lo > hi:
        return out
    names = [k for k, _, _ in spans]
    w = width(lo, hi, max_points)
    if w == 1:
        for key, step, value in _points(session, run_id, names, [(lo, hi)]):
            point = _read(value)
            out[key].append(Point(step, point, point, point))
        return out
    summaries: dict[str, dict[int, Summary]] = {k: {} for k in names}
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
            for key, bucket, *summary in _tier(
                session, run_id, names, level, b_lo << shift, ((b_hi + 1) << shift) - 1
            ):
                _merge(summaries[key], bucket >> shift, summary)
    if from_points:
        for key, step, value in _points(session, run_id, names, from_points):
            _merge(summaries[key], step // w, [1, value, value, step, value])
    for key, buckets in summaries.items():
        out[key] = [_point(buckets[b]) for b in sorted(buckets)]
    return out


def _tier(
    session: Session, run_id: str, keys: Sequence[str], level: int, lo: int, hi: int
) -> Iterable[Any]:
    """(key, bucket, *summary) of ``keys`` in one tier's buckets ``[lo, hi]``, by key and bucket
    (rows streamed from the cursor: a third of the cost of a list of them, read once anyway)."""
    return session.connection().execute(  # Core rows: no ORM cost per row
        select(
            MetricBucket.key,
            MetricBucket.bucket,
            MetricBucket.count,
            MetricBucket.min,
            MetricBucket.max,
            MetricBucket.last_step,
            MetricBucket.last_value,
        )
        .where(
            MetricBucket.run_id == run_id,
            MetricBucket.key.in_(keys),
            MetricBucket.level == level,
            MetricBucket.bucket.between(lo, hi),
        )
        .order_by(MetricBucket.key, MetricBucket.bucket)
    )


def _merge(buckets: dict[int, Summary], bucket: int, summary: Summary) -> None:
    seen = buckets.get(bucket)
    if seen is None:
        buckets[bucket] = summary
    else:
        _absorb(seen, summary)


def _points(
    session: Session, run_id: str, keys: Sequence[str], ranges: Sequence[tuple[int, int]]
) -> Iterable[Any]:
    """(key, step, value) of ``keys`` in the step ranges, by key and step (streamed, as above)."""
    return session.connection().execute(
        select(MetricPoint.key, MetricPoint.step, MetricPoint.value)
        .where(
            MetricPoint.run_id == run_id,
            MetricPoint.key.in_(keys),
            or_(*(MetricPoint.step.between(a, b) for a, b in ranges)),
        )
        .order_by(MetricPoint.key, MetricPoint.step)
    )


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
