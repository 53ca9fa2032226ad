"""A team's baseline run per recipe, and every other run's difference from it at the same step.

A member pins one of its team's runs as the baseline of its team and recipe (an admin any
team's), replacing the one before; unpinning takes it off. Both are audited like other run
writes (``run.baseline_pin``, ``run.baseline_unpin``). Another run of that team and recipe is
compared at its newest logged step of each key: its value there less the baseline's value at
the same step (the baseline's newest point at or before it, and that step told)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import delete, select, tuple_
from sqlalchemy.orm import Session

from service.errors import Conflict
from service.metrics.keys import RESPONSE_LENGTH_KEY, REWARD_KEY, STEP_TIME_KEY
from service.operations.parts import Parts
from service.principal import Principal, record_call, visible_run
from service.store.models import Baseline, MetricKey, MetricPoint, utcnow
from service.wire.documents import attributes
from service.wire.runs import BaselineOut

# What a difference is taken on, by its name in the answer.
COMPARED = {
    "reward": REWARD_KEY,
    "response_length": RESPONSE_LENGTH_KEY,
    "step_time": STEP_TIME_KEY,
}
KEYS = tuple(COMPARED.values())
Latest = Mapping[str, tuple[int, float]]


def baseline_doc(row: Baseline) -> dict[str, Any]:
    return attributes(row, BaselineOut.model_fields)


def pin(parts: Parts, principal: Principal, run_id: str, client: str | None) -> dict[str, Any]:
    """Make the run the baseline of its team and recipe (``wire.runs.BaselineOut``)."""
    with parts.db.transaction() as session:
        run = visible_run(session, principal, run_id, lock=True)
        session.execute(
            delete(Baseline).where(Baseline.team == run.team, Baseline.recipe == run.recipe)
        )
        row = Baseline(
            team=run.team, recipe=run.recipe, run_id=run.id, pinned_by=principal.user,
            pinned_at=utcnow(),
        )  # fmt: skip
        session.add(row)
        record_call(session, principal, client, "run.baseline_pin", run_id=run.id, target=run.team)
        session.flush()
        return baseline_doc(row)


def unpin(parts: Parts, principal: Principal, run_id: str, client: str | None) -> None:
    """Take the run off as its team's and recipe's baseline; 409 if it is not the baseline."""
    with parts.db.transaction() as session:
        run = visible_run(session, principal, run_id, lock=True)
        gone = session.execute(
            delete(Baseline).where(Baseline.team == run.team, Baseline.recipe == run.recipe,
                                   Baseline.run_id == run.id)
        )  # fmt: skip
        if not gone.rowcount:  # type: ignore[attr-defined]
            raise Conflict(f"run {run_id} is not the baseline of {run.team}/{run.recipe}")
        record_call(
            session, principal, client, "run.baseline_unpin", run_id=run.id, target=run.team
        )


def _value_at(session: Session, run_id: str, key: str, step: int) -> tuple[int, float] | None:
    """The run's newest point of ``key`` at or before ``step``."""
    row = session.execute(
        select(MetricPoint.step, MetricPoint.value)
        .join(MetricKey, MetricKey.id == MetricPoint.key_id)
        .where(MetricKey.run_id == run_id, MetricKey.key == key, MetricPoint.step <= step)
        .order_by(MetricPoint.step.desc())
        .limit(1)
    ).first()
    if row is None or row.value is None or not math.isfinite(row.value):
        return None
    return int(row.step), float(row.value)


def diffs(
    session: Session, runs: Sequence[Any], latest: Mapping[str, Latest]
) -> dict[str, dict[str, Any]]:
    """Each run's difference from its team's and recipe's baseline (none for the baseline
    itself, or where there is none): per compared key, the run's newest value, the baseline's at
    the same step and their difference."""
    pairs = {(r.team, r.recipe) for r in runs}
    if not pairs:
        return {}
    rows = session.scalars(
        select(Baseline).where(tuple_(Baseline.team, Baseline.recipe).in_(list(pairs)))
    ).all()
    by_pair = {(b.team, b.recipe): b.run_id for b in rows}
    out: dict[str, dict[str, Any]] = {}
    for run in runs:
        base = by_pair.get((run.team, run.recipe))
        if base is None:
            continue
        doc: dict[str, Any] = {"run_id": base, "is_baseline": base == run.id}
        if base != run.id:
            for name, key in COMPARED.items():
                mine = (latest.get(run.id) or {}).get(key)
                theirs = _value_at(session, base, key, mine[0]) if mine else None
                doc[name] = None
                if mine and theirs and math.isfinite(mine[1]):
                    doc[name] = {
                        "step": mine[0],
                        "value": mine[1],
                        "baseline_step": theirs[0],
                        "baseline_value": theirs[1],
                        "difference": mine[1] - theirs[1],
                    }
        out[run.id] = doc
    return out
