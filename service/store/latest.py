"""Which of a run's metrics its page and lists show as ``metrics.latest``, read from the latest
values the metric store keeps (``metric_keys``): the statement the run's page reads them with,
owned here so that the store's run reads need nothing above the store."""

from __future__ import annotations

from sqlalchemy import ColumnElement, and_, bindparam, or_, select
from sqlalchemy.orm import InstrumentedAttribute

from service.metrics.keys import (
    REWARD_KEY,
    REWARD_MAX_KEY,
    REWARD_MIN_KEY,
    STALE_KEY,
    STEP_KEY,
    TRAINER_STEP_KEY,
)
from service.store.models import MetricKey

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
