"""The metric store, the kept log copy and the follower's lease, on SQLite and PostgreSQL."""

from __future__ import annotations

import math
from datetime import timedelta
from typing import Any

from sqlalchemy import select, update

from service.loops.follower import Follower
from service.metrics import logcopy, store
from service.metrics.health import HealthRules
from service.metrics.log_readers import WholeLogReader
from service.metrics.parse import MetricLine
from service.store.db import Database
from service.store.models import MetricPoint, Run, RunLog, utcnow
from service.store.status import RunStatus
from tests.factories import add_run, read_run
from tests.fake_ray import FakeRay


def follower(db: Database, ray: FakeRay, owner: str, **rules: Any) -> Follower:
    return Follower(db, ray, owner, 30, 10_000, HealthRules(**rules), reader=WholeLogReader(ray))


def points(db: Database, run_id: str) -> list[tuple[int, str, float | None]]:
    with db.transaction() as s:
        rows = s.execute(
            select(MetricPoint.step, MetricPoint.key, MetricPoint.value)
            .where(MetricPoint.run_id == run_id)
            .order_by(MetricPoint.step, MetricPoint.key)
        ).all()
    return [(a, b, c) for a, b, c in rows]


def test_storing_the_same_lines_twice_adds_nothing_and_nan_inf_survive(db: Database) -> None:
    run_id = add_run(db)
    lines = [
        (10, MetricLine(1, {"a": 0.5, "loss": math.nan, "big": math.inf, "low": -math.inf})),
        (20, MetricLine(2, {"a": 0.7})),
    ]
    for _ in range(2):
        with db.transaction() as s:
            store.add_lines(s, run_id, lines)
    stored = points(db, run_id)
    assert len(stored) == 5
    with db.transaction() as s:
        series = {k: store.series(s, run_id, k, 100) for k in ("loss", "big", "low")}
        replay = store.lines_after(s, run_id, 10)
    assert math.isnan(series["loss"][0].value)
    assert series["big"][0].value == math.inf and series["low"][0].value == -math.inf
    assert replay == [(20, 2, {"a": 0.7})]


def test_downsampling_keeps_each_buckets_last_value_with_its_min_and_max(db: Database) -> None:
    run_id = add_run(db)
    values = [float((i * 37) % 101) for i in range(1000)]
    with db.transaction() as s:
        store.add_lines(s, run_id, [(i + 1, MetricLine(i, {"k": v})) for i, v in enumerate(values)])
    with db.transaction() as s:
        got = store.series(s, run_id, "k", 10)
        window = store.series(s, run_id, "k", 10, from_step=100, to_step=199)
    assert len(got) == 10
    for n, point in enumerate(got):
        bucket = values[n * 100 : (n + 1) * 100]
        assert (point.step, point.value) == (n * 100 + 99, bucket[-1])
        assert (point.min, point.max) == (min(bucket), max(bucket))
    assert window[0].min == min(values[100:110]) and window[-1].step == 199


def test_latest_gives_each_watched_key_at_its_newest_step(db: Database) -> None:
    run_id = add_run(db)
    lines = [
        (1, MetricLine(1, {"critic/score/mean": 0.1, "val-core/x/acc/mean@1": 0.2})),
        (2, MetricLine(2, {"critic/score/mean": 0.4, "other": 9.0})),
    ]
    with db.transaction() as s:
        store.add_lines(s, run_id, lines)
        latest = store.latest(s, run_id)
    assert latest == {"critic/score/mean": (2, 0.4), "val-core/x/acc/mean@1": (1, 0.2)}


def test_the_kept_log_copy_is_bounded_and_tails_by_lines(db: Database) -> None:
    run_id = add_run(db)
    offset = 0
    with db.transaction() as s:
        for i in range(100):
            text = f"line {i}\n"
            logcopy.append(s, run_id, offset, text, keep_chars=200)
            offset += len(text)
    with db.transaction() as s:
        assert logcopy.tail(s, run_id, 2) == "line 98\nline 99\n"
        kept = logcopy.tail(s, run_id, None)
    assert kept.endswith("line 99\n") and 200 <= len(kept) < 220


def test_the_follower_resumes_at_its_offset_and_reads_a_partial_last_line_only_at_the_end(
    db: Database,
) -> None:
    run_id, ray = add_run(db), FakeRay()
    ray.log[run_id] = "hello\nstep:1 - a:1.0\nstep:2 - a:2."
    follower(db, ray, "one").tick()
    assert points(db, run_id) == [(1, "a", 1.0)]
    follower(db, ray, "one").tick()  # a restart of the same replica re-reads nothing
    assert points(db, run_id) == [(1, "a", 1.0)]
    ray.log[run_id] += "5"
    with db.transaction() as s:
        run = s.get(Run, run_id)
        assert run is not None and run.last_output_at is not None
        run.status = RunStatus.SUCCEEDED
    follower(db, ray, "one").tick()
    assert points(db, run_id) == [(1, "a", 1.0), (2, "a", 2.5)]
    with db.transaction() as s:
        runlog = s.get(RunLog, run_id)
        assert runlog is not None and runlog.finished_at is not None
        assert logcopy.tail(s, run_id, None) == ray.log[run_id]


def test_a_run_is_followed_by_one_replica_until_its_lease_lapses(db: Database) -> None:
    run_id, ray = add_run(db), FakeRay()
    ray.log[run_id] = "step:1 - a:1\n"
    first, second = follower(db, ray, "one"), follower(db, ray, "two")
    first.tick()
    ray.log[run_id] += "step:2 - a:2\n"
    second.tick()
    assert [p[0] for p in points(db, run_id)] == [1]
    with db.transaction() as s:
        s.execute(update(RunLog).values(lease_expires_at=utcnow() - timedelta(seconds=1)))
    second.tick()
    assert [p[0] for p in points(db, run_id)] == [1, 2]
    with db.transaction() as s:
        assert s.scalar(select(RunLog.lease_owner)) == "two"


def test_nan_in_a_loss_and_a_reward_collapse_show_in_health_with_a_reason(db: Database) -> None:
    run_id, ray = add_run(db), FakeRay()
    rewards = [0.2, 0.6, 0.9, 0.8, 0.3, 0.2, 0.1]
    ray.log[run_id] = "".join(
        f"step:{i} - critic/score/mean:{r} - actor/pg_loss:0.1\n" for i, r in enumerate(rewards)
    )
    f = follower(db, ray, "one")
    f.tick()
    run, _ = read_run(db, run_id)
    assert run.health == "reward_collapse" and "0.9 (step 2)" in (run.health_reason or "")
    ray.log[run_id] += "step:7 - critic/score/mean:0.1 - actor/pg_loss:nan\n"
    f.tick()
    run, reasons = read_run(db, run_id)
    assert run.health == "nan" and run.health_reason == "actor/pg_loss is NaN at step 7"
    assert len(reasons) == 2


def test_a_run_without_a_new_step_for_too_long_is_stalled(db: Database) -> None:
    run_id, ray = add_run(db), FakeRay()
    ray.log[run_id] = "step:1 - a:1\n"
    f = follower(db, ray, "one", stall_after_s=60)
    f.tick()
    with db.transaction() as s:
        s.execute(update(RunLog).values(last_step_at=utcnow() - timedelta(seconds=120)))
    f.tick()
    f.tick()
    run, reasons = read_run(db, run_id)
    assert run.health == "stalled" and (run.health_reason or "").startswith("no new step for 1")
    assert len(reasons) == 1


def test_a_job_ray_does_not_know_is_left_to_the_reconciler_until_the_run_ends(
    db: Database,
) -> None:
    run_id, ray = add_run(db), FakeRay()
    f = follower(db, ray, "one")
    f.tick()
    with db.transaction() as s:
        runlog = s.get(RunLog, run_id)
        assert runlog is not None and runlog.log_offset == 0 and runlog.finished_at is None
        s.execute(update(Run).values(status=RunStatus.LOST))
    f.tick()  # the final read of an ended run finishes its follower even without a log
    with db.transaction() as s:
        runlog = s.get(RunLog, run_id)
        assert runlog is not None and runlog.finished_at is not None
