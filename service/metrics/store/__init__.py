"""Metric points in the database: idempotent batch writes, latest values, history tiers.

A run's keys are rows of ``metric_keys`` (with each key's latest value); points and tiers are
keyed by the key's integer id. A batch looks up (and adds) its keys once, then stores its
points, latest values and tiers: on PostgreSQL in one statement (one round trip), on SQLite in
three in-process statements.

NaN is stored as NULL (SQLite turns NaN into NULL anyway, so both backends agree); ``±inf`` is
stored as itself. Reads hand NULL back as ``nan``. Writes flush, never commit.

Its parts: ``writes`` (ingest, and the points a resumed attempt supersedes), ``tiers``
(downsampling), ``reads``, and ``rows`` (what they share). This package names what the rest of
the service calls, so callers say ``store.add_lines``, ``store.series``.
"""

from __future__ import annotations

from service.metrics.store.reads import (
    LINES_AFTER,
    LINES_LIMIT,
    as_lines,
    first,
    highest,
    keys_of,
    latest,
    latest_every,
    latest_of_runs,
    lines_after,
    recent,
    series,
)
from service.metrics.store.rows import Point
from service.metrics.store.tiers import LEVELS, width
from service.metrics.store.writes import (
    BIG_STEP,
    KEYS_FULL,
    LONG_KEY,
    POINTS_FULL,
    Budget,
    Limits,
    add_lines,
    ingest,
    storable,
    supersede,
    superseded,
    within,
)
from service.store.latest import LATEST_KEYS, LATEST_OF_RUN, latest_of

__all__ = [
    "BIG_STEP",
    "KEYS_FULL",
    "LATEST_KEYS",
    "LATEST_OF_RUN",
    "LEVELS",
    "LINES_AFTER",
    "LINES_LIMIT",
    "LONG_KEY",
    "POINTS_FULL",
    "Budget",
    "Limits",
    "Point",
    "add_lines",
    "as_lines",
    "first",
    "highest",
    "ingest",
    "keys_of",
    "latest",
    "latest_every",
    "latest_of",
    "latest_of_runs",
    "lines_after",
    "recent",
    "series",
    "storable",
    "supersede",
    "superseded",
    "width",
    "within",
]
