"""What the metric store's parts share: its tables as Core tables, the columns' bounds, how a
value is stored (NaN as NULL) and read back."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import cast

from sqlalchemy import Table
from sqlalchemy.orm import Session

from service.store.models import MetricBucket, MetricKey, MetricPoint

# What the columns hold (``metric_keys.key``, ``metric_points.step``): past them is dropped.
KEY_MAX = 200
STEP_MAX = 2**63 - 1


# The tables as Core tables (statements of many rows, no ORM cost per row).
KEYS = cast(Table, MetricKey.__table__)
POINTS = cast(Table, MetricPoint.__table__)
BUCKETS = cast(Table, MetricBucket.__table__)
# Keys per lookup of those a run holds: a statement binds at most 65,535 values (psycopg).
KEYS_PER_QUERY = 500


@dataclass(slots=True)  # not frozen: a read makes one per answered point, and frozen doubles that
class Point:
    step: int
    value: float
    min: float
    max: float


def stored(value: float) -> float | None:
    return None if math.isnan(value) else value


def read_value(value: float | None) -> float:
    return math.nan if value is None else value


def on_postgres(session: Session) -> bool:
    return session.get_bind().dialect.name == "postgresql"
