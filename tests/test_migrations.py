"""Alembic: upgrade, downgrade and upgrade again on SQLite and PostgreSQL; models match."""

from __future__ import annotations

import json
import math

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import create_engine, inspect, select, text

from jobs import samples as frames
from service.metrics import samples, store
from service.metrics.parse import MetricLine
from service.store.db import Database, downgrade, upgrade
from service.store.models import TEXT_SEARCH_INDEXES, Base, MetricKey, RunLog, utcnow
from tests.factories import add_run


def _tables(url: str) -> set[str]:
    engine = create_engine(url)
    names = set(inspect(engine).get_table_names()) - {"alembic_version"}
    engine.dispose()
    return names


def _old_run(db: Database, run_id: str) -> str:
    """A run as the first schema holds it (the models have columns an old schema lacks)."""
    with db.transaction() as s:
        s.execute(
            text(
                "INSERT INTO runs (id, name, recipe, team, priority, status, health, spec, "
                "launch, created_at, updated_at) VALUES (:id, :id, 'x', 't', 1, 'RUNNING', "
                "'ok', '{}', '{}', :now, :now)"
            ),
            {"id": run_id, "now": utcnow()},
        )
    return run_id


def test_upgrade_downgrade_upgrade_round_trips(db_url: str) -> None:
    upgrade(db_url)
    assert _tables(db_url) == set(Base.metadata.tables)
    downgrade(db_url, "base")
    assert _tables(db_url) == set()
    upgrade(db_url)
    assert _tables(db_url) == set(Base.metadata.tables)


def test_models_match_the_migrations(db_url: str) -> None:
    upgrade(db_url)
    engine = create_engine(db_url)
    with engine.connect() as conn:
        # The text filter's trigram indexes are PostgreSQL's alone, and not in the model.
        skip = {"include_name": lambda name, kind, _: name not in TEXT_SEARCH_INDEXES}
        diff = compare_metadata(MigrationContext.configure(conn, opts=skip), Base.metadata)
    engine.dispose()
    assert diff == []


def test_the_metric_tiers_migration_fills_latest_values_and_buckets_from_stored_points(
    db_url: str,
) -> None:
    upgrade(db_url)
    downgrade(db_url, "0003")
    db = Database(db_url)
    run_id = _old_run(db, "r1")
    points = [("a", step, float(step % 7) if step % 5 else None) for step in range(0, 3000, 3)]
    points += [("b", 40, 1.0)]
    with db.transaction() as s:
        s.execute(
            text(
                "INSERT INTO metric_points (run_id, key, step, value, log_offset) "
                "VALUES (:r, :k, :s, :v, 0)"
            ),
            [{"r": run_id, "k": k, "s": st, "v": v} for k, st, v in points],
        )
    upgrade(db_url)
    with db.transaction() as s:
        migrated = store.series(s, run_id, ["a", "b"], 50)
        latest = s.execute(select(MetricKey.key, MetricKey.first_step, MetricKey.step))
        assert sorted(latest) == [("a", 0, 2997), ("b", 40, 40)]
    # The same points stored through ingest read back the same.
    other = add_run(db, "r2")
    with db.transaction() as s:
        store.add_lines(
            s,
            other,
            [(0, MetricLine(st, {k: math.nan if v is None else v})) for k, st, v in points],
        )
        assert store.series(s, other, ["a", "b"], 50) == migrated
    db.dispose()
    downgrade(db_url, "0003")
    assert {"metric_latest", "metric_buckets"}.isdisjoint(_tables(db_url))
    upgrade(db_url)


def test_the_metric_counts_migration_counts_what_each_run_holds(db_url: str) -> None:
    upgrade(db_url)
    db = Database(db_url)
    held, empty = _old_run(db, "r1"), _old_run(db, "r2")
    lines = [(0, MetricLine(step, {"a": 1.0})) for step in range(0, 10_000, 3)]  # 3 top buckets
    with db.transaction() as s:
        store.add_lines(s, held, [*lines, (0, MetricLine(7, {"b": math.nan}))])
        s.execute(
            text("INSERT INTO run_logs (run_id, log_offset) VALUES (:r, 0)"),
            [{"r": held}, {"r": empty}],
        )
    db.dispose()
    downgrade(db_url, "0007")
    upgrade(db_url)
    with db.transaction() as s:
        counts = {r.run_id: (r.metric_keys, r.metric_points) for r in s.scalars(select(RunLog))}
    db.dispose()
    assert counts == {held: (2, len(lines) + 1), empty: (0, 0)}


def _everything_read(db: Database, run_ids: list[str]) -> list[object]:
    """What each read path answers for the runs (NaN as a string, so answers compare)."""
    out: list[object] = []
    with db.transaction() as s:
        for run_id in run_ids:
            out += [
                list(store.keys_of(s, run_id)),
                store.latest(s, run_id),
                store.latest_of_runs(s, [run_id], ["critic/score/mean", "actor/loss"]),
                store.recent(s, run_id, "critic/score/mean", 50),
                store.lines_after(s, run_id, 0),
                store.lines_after(s, run_id, 5_000),
                *(
                    store.series(s, run_id, None, n, lo, hi)
                    for n, lo, hi in ((10_000, None, None), (40, None, None), (7, 333, 2_901))
                ),
            ]
    return [repr(x) for x in out]


def test_points_stored_before_the_key_ids_migration_read_back_the_same_after_it(
    db_url: str,
) -> None:
    upgrade(db_url)
    db = Database(db_url)
    runs = [add_run(db, "r1"), add_run(db, "r2")]
    for n, run_id in enumerate(runs):
        lines = [
            (
                step * 10 + 10,
                MetricLine(
                    step,
                    {
                        "critic/score/mean": (step % 17) / 17 + n,
                        "actor/loss": math.nan if step % 5 == 0 else -step / 3,
                        **({"big": math.inf, "low": -math.inf} if step % 100 == 0 else {}),
                    },
                ),
            )
            for step in range(0, 3_000, 1 + n)
        ]
        with db.transaction() as s:
            store.add_lines(s, run_id, lines)
    before = _everything_read(db, runs)
    db.dispose()
    downgrade(db_url, "0008")
    # Now in the earlier layout: points, latest values and tiers named by run and key.
    with db.transaction() as s:
        stored = s.execute(text("SELECT run_id, key, count(*) FROM metric_points GROUP BY 1, 2"))
        assert sorted(stored)[0] == ("r1", "actor/loss", 3_000)
        assert s.scalar(text("SELECT count(*) FROM metric_latest")) == 8
        assert s.scalar(text("SELECT count(DISTINCT key) FROM metric_buckets")) == 4
    db.dispose()
    upgrade(db_url)
    assert _everything_read(db, runs) == before
    # Ingest goes on after it: a new key gets an id of its own, an old one keeps its points.
    with db.transaction() as s:
        store.add_lines(
            s, "r1", [(40_000, MetricLine(3_000, {"critic/score/mean": 9.0, "new": 1.0}))]
        )
        assert store.recent(s, "r1", "critic/score/mean", 2) == [(2_999, 7 / 17), (3_000, 9.0)]
        assert store.recent(s, "r2", "new", 5) == []
        assert len(store.keys_of(s, "r1")) == 5
    db.dispose()


def test_the_run_cluster_migration_puts_every_existing_run_on_the_default_cluster(
    db_url: str,
) -> None:
    upgrade(db_url)
    downgrade(db_url, "0020")
    db = Database(db_url)
    _old_run(db, "r1")
    upgrade(db_url)
    with db.transaction() as s:
        assert s.scalar(text("SELECT cluster FROM runs WHERE id = 'r1'")) == "default"
    db.dispose()
    downgrade(db_url, "0020")
    upgrade(db_url)


def test_the_sample_steps_migration_sums_the_samples_already_held(db_url: str) -> None:
    upgrade(db_url)
    db = Database(db_url)
    run_id = _old_run(db, "r1")
    framed = [
        f"{frames.PREFIX}"
        + json.dumps(
            {"step": 1 + i % 3, "input": f"p{i}", "output": "o", "gts": "g", "score": i / 8}
        )
        for i in range(12)
    ]
    with db.transaction() as s:
        runlog = RunLog(run_id=run_id, log_offset=0)
        s.add(runlog)
        s.flush()
        samples.ingest(s, runlog, samples.parse(framed), samples.Bounds())
    with db.read() as s:
        kept = samples.steps(s, run_id)
    db.dispose()
    downgrade(db_url, "0027")
    upgrade(db_url)
    with db.read() as s:
        assert samples.steps(s, run_id) == kept
    db.dispose()
    assert [x["count"] for x in kept] == [4, 4, 4]
