"""Metric points in the database: idempotent batch writes, latest values, history tiers.

A run's keys are rows of ``metric_keys`` (with each key's latest value); points and tiers are
keyed by the key's integer id. A batch looks up (and adds) its keys once, then stores its
points, latest values and tiers: on PostgreSQL in one statement (one round trip), on SQLite in
three in-process statements.

NaN is stored as NULL (SQLite turns NaN into NULL anyway, so both backends agree); ``±inf`` is
stored as itself. Reads hand NULL back as ``nan``. Writes flush, never commit.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, cast

from sqlalchemy import (
    ColumnElement,
    Table,
    and_,
    bindparam,
    case,
    delete,
    func,
    insert,
    or_,
    select,
    text,
    tuple_,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import InstrumentedAttribute, Session

from service.metrics.keys import (
    REWARD_KEY,
    REWARD_MAX_KEY,
    REWARD_MIN_KEY,
    STALE_KEY,
    STEP_KEY,
    TRAINER_STEP_KEY,
)
from service.metrics.parse import MetricLine
from service.store.models import MetricBucket, MetricKey, MetricPoint, RunLog

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
# What the columns hold (``metric_keys.key``, ``metric_points.step``): past them is dropped.
KEY_MAX = 200
STEP_MAX = 2**63 - 1
LONG_KEY = "metric points dropped: a key is longer than"
BIG_STEP = "metric line dropped: its step is above"
# What one run may hold (``Limits``): past them, new keys or any points are dropped.
KEYS_FULL = "metric keys dropped: the run holds its limit of"
POINTS_FULL = "metric points dropped: the run holds its limit of"
# The tables as Core tables (statements of many rows, no ORM cost per row).
_KEYS = cast(Table, MetricKey.__table__)
_POINTS = cast(Table, MetricPoint.__table__)
_BUCKETS = cast(Table, MetricBucket.__table__)
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
    # A run at its point limit stores nothing: which keys it holds does not matter.
    full = runlog.metric_points >= limits.points
    names = [] if full else sorted({key for _, line in lines for key in line.values})
    ids = _ids_of(session, runlog.run_id, names)
    budget = Budget(limits, runlog.metric_keys, runlog.metric_points, frozenset(ids))
    kept, notes = within(lines, budget)
    wanted = {key for _, line in kept for key in line.values} - set(ids)
    added, created = _add_keys(session, runlog.run_id, wanted)
    new = _add(session, runlog.run_id, kept, ids | added)
    runlog.metric_points += new
    runlog.metric_keys += created
    return new, notes


def _ids_of(session: Session, run_id: str, names: Sequence[str]) -> dict[str, int]:
    """Key -> id of those of ``names`` the run holds."""
    ids: dict[str, int] = {}
    for n in range(0, len(names), _KEYS_PER_QUERY):
        rows = session.execute(
            select(MetricKey.key, MetricKey.id).where(
                MetricKey.run_id == run_id,
                MetricKey.key.in_(names[n : n + _KEYS_PER_QUERY]),
            )
        )
        ids.update(rows.tuples().all())
    return ids


# A new key's latest value until its points are stored (in the same statement or the next).
_NO_STEP = -(2**63)


def _add_keys(session: Session, run_id: str, names: set[str]) -> tuple[dict[str, int], int]:
    """Key -> id of ``names``, added to the run (its existence checked once per new key, by
    ``metric_keys``' foreign key), and how many this added: one another writer added meanwhile
    is looked up."""
    if not names:
        return {}, 0
    rows = [
        {"run_id": run_id, "key": k, "first_step": STEP_MAX, "step": _NO_STEP, "value": None}
        for k in sorted(names)
    ]
    stmt = dialect_insert(session)(_KEYS).on_conflict_do_nothing(index_elements=["run_id", "key"])
    added = dict(session.execute(stmt.returning(MetricKey.key, MetricKey.id), rows).tuples().all())
    created = len(added)
    if created < len(names):
        added |= _ids_of(session, run_id, sorted(names - set(added)))
    return added, created


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


def _point(summary: Summary) -> Point:
    return Point(summary[3], _read(summary[4]), _read(summary[1]), _read(summary[2]))


def _postgres(session: Session) -> bool:
    return session.get_bind().dialect.name == "postgresql"


def add_lines(session: Session, run_id: str, lines: Iterable[tuple[int, MetricLine]]) -> int:
    """Store each ``(end offset, line)``'s values; a (run, key, step) already stored is kept.
    The latest values and history tiers take in exactly the points that were new, in the same
    transaction, so storing the same lines again changes nothing. Returns the points offered.
    Unbounded and uncounted: a followed run's lines go through ``ingest``."""
    lines = list(lines)
    names = sorted({key for _, line in lines for key in line.values})
    ids = _ids_of(session, run_id, names)
    added, _ = _add_keys(session, run_id, set(names) - set(ids))
    _add(session, run_id, lines, ids | added)
    return sum(len(line.values) for _, line in lines)


def _add(
    session: Session, run_id: str, lines: Sequence[tuple[int, MetricLine]], ids: dict[str, int]
) -> int:
    """``add_lines`` with the keys' ids at hand; the number of points that were new."""
    if not any(line.values for _, line in lines):
        return 0
    if _postgres(session):
        return _add_postgres(session, run_id, lines, ids)
    rows = [
        {
            "key_id": ids[key],
            "step": line.step,
            "value": _stored(value),
            "log_offset": offset,
            "run_id": run_id,
        }
        for offset, line in lines
        for key, value in line.values.items()
    ]
    new = session.execute(
        sqlite.insert(_POINTS)
        .on_conflict_do_nothing(index_elements=["key_id", "step"])
        .returning(MetricPoint.key_id, MetricPoint.step, MetricPoint.value),
        rows,
    ).all()
    if new:
        _keep_latest(session, new)
        _keep_buckets(session, new)
    return len(new)


# PostgreSQL: the points (four arrays, one element per point), the keys' latest values and the
# tiers in one statement; what it hands back is the number of points that were new. A point
# already stored is skipped (the first of a batch's duplicates wins) and only the new ones reach
# the latest values and tiers, exactly as ``_keep_latest`` and ``_keep_buckets`` do on SQLite.
_ADD_POSTGRES = text(
    """
WITH new AS (
    INSERT INTO metric_points (key_id, step, value, log_offset, run_id)
    SELECT k, s, v, o, :run_id
    FROM unnest(CAST(:keys AS integer[]), CAST(:steps AS bigint[]),
                CAST(:values AS float8[]), CAST(:offsets AS bigint[])) AS t (k, s, v, o)
    ON CONFLICT DO NOTHING
    RETURNING key_id, step, value
), finest AS (
    -- The new points in the finest tier's buckets: what the coarser tiers and latest fold.
    SELECT key_id, step >> :finest AS bucket, count(*) AS n, min(value) AS lo,
           max(value) AS hi, min(step) AS first_step, max(step) AS last_step,
           (array_agg(value ORDER BY step DESC))[1] AS last_value
    FROM new GROUP BY key_id, step >> :finest
), latest AS (
    UPDATE metric_keys AS m SET
        first_step = least(m.first_step, n.first_step),
        step = greatest(m.step, n.step),
        value = CASE WHEN n.step > m.step THEN n.value ELSE m.value END
    FROM (
        SELECT key_id, min(first_step) AS first_step, max(last_step) AS step,
               (array_agg(last_value ORDER BY last_step DESC))[1] AS value
        FROM finest GROUP BY key_id
    ) AS n
    WHERE m.id = n.key_id
), tiers AS (
    INSERT INTO metric_buckets AS b
        (key_id, level, bucket, count, min, max, last_step, last_value)
    SELECT key_id, level, bucket >> (level - :finest), sum(n), min(lo), max(hi),
           max(last_step), (array_agg(last_value ORDER BY last_step DESC))[1]
    FROM finest CROSS JOIN unnest(CAST(:levels AS smallint[])) AS l (level)
    GROUP BY key_id, level, bucket >> (level - :finest)
    ON CONFLICT (key_id, level, bucket) DO UPDATE SET
        count = b.count + excluded.count,
        min = least(b.min, excluded.min),
        max = greatest(b.max, excluded.max),
        last_step = greatest(b.last_step, excluded.last_step),
        last_value = CASE WHEN excluded.last_step > b.last_step
                          THEN excluded.last_value ELSE b.last_value END
)
SELECT count(*) FROM new
"""
)


def _array(items: Iterable[object]) -> str:
    """A PostgreSQL array literal of numbers (``NULL``, ``inf``, ``-inf`` as PostgreSQL reads
    them): one text parameter, much cheaper to send than a list bound element by element."""
    return "{" + ",".join(map(str, items)) + "}"


def _add_postgres(
    session: Session, run_id: str, lines: Sequence[tuple[int, MetricLine]], ids: dict[str, int]
) -> int:
    keys: list[int] = []
    steps: list[int] = []
    values: list[object] = []
    offsets: list[int] = []
    for offset, line in lines:
        n = len(line.values)
        keys += [ids[k] for k in line.values]
        steps += [line.step] * n
        values += ["NULL" if math.isnan(v) else float(v) for v in line.values.values()]
        offsets += [offset] * n
    params = {
        "run_id": run_id,
        "keys": _array(keys),
        "steps": _array(steps),
        "values": _array(values),
        "offsets": _array(offsets),
        "levels": _array(LEVELS),
        "finest": LEVELS[0],
    }
    return int(session.execute(_ADD_POSTGRES, params).scalar_one())


def _keep_latest(session: Session, new: Sequence[Any]) -> None:
    """SQLite: the keys' latest values and first steps take in the new points."""
    latest: dict[int, list[Any]] = {}  # key id -> [first step, step, value]
    for key_id, step, value in new:
        seen = latest.get(key_id)
        if seen is None:
            latest[key_id] = [step, step, value]
        else:
            seen[0] = min(seen[0], step)
            if step > seen[1]:
                seen[1:] = [step, value]
    keys = _KEYS.c
    newer = bindparam("s") > keys.step
    session.connection().execute(
        update(_KEYS)
        .where(keys.id == bindparam("kid"))
        .values(
            # SQLite's scalar min gives the lower; both are set here.
            first_step=func.min(keys.first_step, bindparam("f")),
            step=case((newer, bindparam("s")), else_=keys.step),
            value=case((newer, bindparam("v")), else_=keys.value),
        ),
        [{"kid": k, "f": f, "s": s, "v": v} for k, (f, s, v) in latest.items()],
    )


def _keep_buckets(session: Session, new: Sequence[Any]) -> None:
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
    stmt = sqlite.insert(_BUCKETS)
    ex, old = stmt.excluded, _BUCKETS.c
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


def latest_of(run_id: ColumnElement[str] | InstrumentedAttribute[str]) -> ColumnElement[bool]:
    """The rows of the latest table that a run's page shows, of the run ``run_id`` (a bound
    parameter, or the outer query's run)."""
    return and_(
        MetricKey.run_id == run_id,
        or_(
            MetricKey.key.in_([bindparam(f"latest_{i}", k) for i, k in enumerate(LATEST_KEYS)]),
            *(MetricKey.key.like(p) for p in LATEST_PATTERNS),
        ),
    )


# Built once, run on the session's connection: a run's read binds its parameters only (building
# and keying a statement costs more than running it).
# The keys as bound values, not an expanding IN (which is rendered again at each execution).
# Parameter ``run_id``; columns key, step, value (NULL: NaN).
LATEST_OF_RUN = select(MetricKey.key, MetricKey.step, MetricKey.value).where(
    latest_of(bindparam("run_id"))
)
_LATEST_OF_RUNS = select(MetricKey.run_id, MetricKey.key, MetricKey.step, MetricKey.value).where(
    MetricKey.run_id.in_(bindparam("run_ids", expanding=True)),
    MetricKey.key.in_(bindparam("keys", expanding=True)),
)


def latest(session: Session, run_id: str) -> dict[str, tuple[int, float]]:
    """Key -> (step, value) at the newest step that key was logged, for the keys users watch."""
    rows = session.connection().execute(LATEST_OF_RUN, {"run_id": run_id})
    return {key: (step, _read(value)) for key, step, value in rows}


def latest_every(session: Session, run_id: str) -> dict[str, tuple[int, float]]:
    """Key -> (step, value) at the newest step that key was logged, for every key, sorted."""
    rows = session.execute(
        select(MetricKey.key, MetricKey.step, MetricKey.value)
        .where(MetricKey.run_id == run_id)
        .order_by(MetricKey.key)
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
    return [(step, _read(value)) for step, value in reversed(rows)]


def first(session: Session, run_id: str, key: str, limit: int) -> list[tuple[int, float]]:
    """The oldest ``limit`` (step, value) pairs of one key, oldest first."""
    key_id = select(MetricKey.id).where(MetricKey.run_id == run_id, MetricKey.key == key)
    rows = session.execute(
        select(MetricPoint.step, MetricPoint.value)
        .where(MetricPoint.key_id == key_id.scalar_subquery())
        .order_by(MetricPoint.step)
        .limit(limit)
    ).all()
    return [(step, _read(value)) for step, value in rows]


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
            point = _read(value)
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
            for key_id, bucket, *summary in _tier(
                session, list(names), level, b_lo << shift, ((b_hi + 1) << shift) - 1
            ):
                _merge(summaries[key_id], bucket >> shift, summary)
    if from_points:
        for key_id, step, value in _points(session, list(names), from_points):
            _merge(summaries[key_id], step // w, [1, value, value, step, value])
    for key_id, buckets in summaries.items():
        out[names[key_id]] = [_point(buckets[b]) for b in sorted(buckets)]
    return out


def _tier(session: Session, keys: Sequence[int], level: int, lo: int, hi: int) -> Iterable[Any]:
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


def _merge(buckets: dict[int, Summary], bucket: int, summary: Summary) -> None:
    seen = buckets.get(bucket)
    if seen is None:
        buckets[bucket] = summary
    else:
        _absorb(seen, summary)


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
        grouped.setdefault((off, step), {})[key] = _read(value)
    if len(rows) == limit and grouped:
        # The last line may be cut by the limit: leave it for the next read.
        grouped.pop(next(reversed(grouped)))
    return [(off, step, values) for (off, step), values in grouped.items()]


def superseded(session: Session, runlog: RunLog) -> bool:
    """Whether a later attempt of the run (its log starting at ``runlog.log_base``) has no
    point stored yet: its first points replace what earlier attempts logged from there on."""
    if not runlog.log_base:
        return False
    pts = _POINTS.c
    mine = select(pts.step).where(pts.run_id == runlog.run_id, pts.log_offset >= runlog.log_base)
    return session.execute(mine.limit(1)).first() is None


def supersede(session: Session, runlog: RunLog, from_step: int) -> int:
    """Drop the points earlier attempts logged at ``from_step`` and after (a resumed attempt
    logs them again), with the tiers and latest values rebuilt from what is left; the number
    of points dropped. One history per run: no step twice, whichever attempt logged it last."""
    run_id, pts = runlog.run_id, _POINTS.c
    gone = session.execute(
        delete(_POINTS).where(
            pts.run_id == run_id, pts.step >= from_step, pts.log_offset < runlog.log_base
        )
    ).rowcount  # type: ignore[attr-defined]
    if not gone:
        return 0
    keys, b = _KEYS.c, _BUCKETS.c
    of_run = select(keys.id).where(keys.run_id == run_id).scalar_subquery()
    for level in LEVELS:
        edge = from_step >> level
        session.execute(
            delete(_BUCKETS).where(b.key_id.in_(of_run), b.level == level, b.bucket >= edge)
        )
        lo = edge << level
        if lo < from_step:  # the bucket the cut falls in keeps its earlier points
            _rebuild(session, run_id, level, edge, lo, from_step)
    p = _POINTS.alias("p")
    newest = (
        select(p.c.step)
        .where(p.c.key_id == keys.id)
        .order_by(p.c.step.desc())
        .limit(1)
        .scalar_subquery()
    )
    value = (
        select(p.c.value)
        .where(p.c.key_id == keys.id)
        .order_by(p.c.step.desc())
        .limit(1)
        .scalar_subquery()
    )
    first = select(func.min(p.c.step)).where(p.c.key_id == keys.id).scalar_subquery()
    session.execute(
        update(_KEYS)
        .where(keys.run_id == run_id, keys.step >= from_step)
        .values(
            step=func.coalesce(newest, _NO_STEP),
            value=value,
            first_step=func.coalesce(first, STEP_MAX),
        )
    )
    runlog.metric_points = max(0, runlog.metric_points - gone)
    if runlog.last_step is not None and runlog.last_step >= from_step:
        runlog.last_step = from_step - 1
    session.flush()
    return int(gone)


def _rebuild(session: Session, run_id: str, level: int, bucket: int, lo: int, hi: int) -> None:
    """One tier's bucket of every key of the run, from its points in ``[lo, hi)``."""
    pts = _POINTS.c
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
        insert(_BUCKETS),
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
