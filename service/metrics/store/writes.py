"""Ingest: a run's metric lines stored as points, idempotently and within the run's limits,
with each key's latest value and the history tiers kept in the same statements (on
PostgreSQL one, on SQLite three); and the points a resumed attempt logs again, superseded."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import bindparam, case, delete, func, select, text, update
from sqlalchemy.dialects import sqlite
from sqlalchemy.orm import Session

from service.metrics.parse import MetricLine
from service.metrics.store.rows import (
    BUCKETS,
    KEY_MAX,
    KEYS,
    KEYS_PER_QUERY,
    POINTS,
    STEP_MAX,
    on_postgres,
    stored,
)
from service.metrics.store.tiers import LEVELS, keep_buckets, rebuild
from service.store.dialect import dialect_insert
from service.store.models import MetricKey, MetricPoint, RunLog

LONG_KEY = "metric points dropped: a key is longer than"
BIG_STEP = "metric line dropped: its step is above"
# What one run may hold (``Limits``): past them, new keys or any points are dropped.
KEYS_FULL = "metric keys dropped: the run holds its limit of"
POINTS_FULL = "metric points dropped: the run holds its limit of"


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
    for n in range(0, len(names), KEYS_PER_QUERY):
        rows = session.execute(
            select(MetricKey.key, MetricKey.id).where(
                MetricKey.run_id == run_id,
                MetricKey.key.in_(names[n : n + KEYS_PER_QUERY]),
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
    stmt = dialect_insert(session)(KEYS).on_conflict_do_nothing(index_elements=["run_id", "key"])
    added = dict(session.execute(stmt.returning(MetricKey.key, MetricKey.id), rows).tuples().all())
    created = len(added)
    if created < len(names):
        added |= _ids_of(session, run_id, sorted(names - set(added)))
    return added, created


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
    if on_postgres(session):
        return _add_postgres(session, run_id, lines, ids)
    rows = [
        {
            "key_id": ids[key],
            "step": line.step,
            "value": stored(value),
            "log_offset": offset,
            "run_id": run_id,
        }
        for offset, line in lines
        for key, value in line.values.items()
    ]
    new = session.execute(
        sqlite.insert(POINTS)
        .on_conflict_do_nothing(index_elements=["key_id", "step"])
        .returning(MetricPoint.key_id, MetricPoint.step, MetricPoint.value),
        rows,
    ).all()
    if new:
        _keep_latest(session, new)
        keep_buckets(session, new)
    return len(new)


# PostgreSQL: the points (four arrays, one element per point), the keys' latest values and the
# tiers in one statement; what it hands back is the number of points that were new. A point
# already stored is skipped (the first of a batch's duplicates wins) and only the new ones reach
# the latest values and tiers, exactly as ``_keep_latest`` and ``keep_buckets`` do on SQLite.
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
    keys = KEYS.c
    newer = bindparam("s") > keys.step
    session.connection().execute(
        update(KEYS)
        .where(keys.id == bindparam("kid"))
        .values(
            # SQLite's scalar min gives the lower; both are set here.
            first_step=func.min(keys.first_step, bindparam("f")),
            step=case((newer, bindparam("s")), else_=keys.step),
            value=case((newer, bindparam("v")), else_=keys.value),
        ),
        [{"kid": k, "f": f, "s": s, "v": v} for k, (f, s, v) in latest.items()],
    )


def superseded(session: Session, runlog: RunLog) -> bool:
    """Whether a later attempt of the run (its log starting at ``runlog.log_base``) has no
    point stored yet: its first points replace what earlier attempts logged from there on."""
    if not runlog.log_base:
        return False
    pts = POINTS.c
    mine = select(pts.step).where(pts.run_id == runlog.run_id, pts.log_offset >= runlog.log_base)
    return session.execute(mine.limit(1)).first() is None


def supersede(session: Session, runlog: RunLog, from_step: int) -> int:
    """Drop the points earlier attempts logged at ``from_step`` and after (a resumed attempt
    logs them again), with the tiers and latest values rebuilt from what is left; the number
    of points dropped. One history per run: no step twice, whichever attempt logged it last."""
    run_id, pts = runlog.run_id, POINTS.c
    gone = session.execute(
        delete(POINTS).where(
            pts.run_id == run_id, pts.step >= from_step, pts.log_offset < runlog.log_base
        )
    ).rowcount  # type: ignore[attr-defined]
    if not gone:
        return 0
    keys, b = KEYS.c, BUCKETS.c
    of_run = select(keys.id).where(keys.run_id == run_id).scalar_subquery()
    for level in LEVELS:
        edge = from_step >> level
        session.execute(
            delete(BUCKETS).where(b.key_id.in_(of_run), b.level == level, b.bucket >= edge)
        )
        lo = edge << level
        if lo < from_step:  # the bucket the cut falls in keeps its earlier points
            rebuild(session, run_id, level, edge, lo, from_step)
    p = POINTS.alias("p")

    def at_newest_step(column: Any) -> Any:
        """``column`` of the key's newest point left."""
        newest_first = select(column).where(p.c.key_id == keys.id).order_by(p.c.step.desc())
        return newest_first.limit(1).scalar_subquery()

    newest, value = at_newest_step(p.c.step), at_newest_step(p.c.value)
    first = select(func.min(p.c.step)).where(p.c.key_id == keys.id).scalar_subquery()
    session.execute(
        update(KEYS)
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
