"""The metric store, the kept log copy and the follower's lease, on SQLite and PostgreSQL."""

from __future__ import annotations

import math
import random
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import func, select, update

from service.loops.follower import Follower
from service.metrics import logcopy, store
from service.metrics.health import HealthRules
from service.metrics.log_readers import WholeLogReader
from service.metrics.parse import MetricLine
from service.metrics.store import writes
from service.store.db import Database
from service.store.models import MetricBucket, MetricKey, MetricPoint, Run, RunLog, utcnow
from service.store.status import RunStatus
from tests.factories import add_run, read_run
from tests.fake_ray import FakeRay

DATA = Path(__file__).parent / "data"


def follower(db: Database, ray: FakeRay, owner: str, **rules: Any) -> Follower:
    return Follower(db, ray, owner, 30, 10_000, HealthRules(**rules), reader=WholeLogReader(ray))


def points(db: Database, run_id: str) -> list[tuple[int, str, float | None]]:
    with db.transaction() as s:
        rows = s.execute(
            select(MetricPoint.step, MetricKey.key, MetricPoint.value)
            .join(MetricKey, MetricKey.id == MetricPoint.key_id)
            .where(MetricPoint.run_id == run_id)
            .order_by(MetricPoint.step, MetricKey.key)
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
        series = {k: v[0] for k, v in store.series(s, run_id, ["loss", "big", "low"], 100).items()}
        replay = store.lines_after(s, run_id, 10)
    assert math.isnan(series["loss"].value)
    assert series["big"].value == math.inf and series["low"].value == -math.inf
    assert replay == [(20, 2, {"a": 0.7})]


def test_downsampling_keeps_each_buckets_last_value_with_its_min_and_max(db: Database) -> None:
    run_id = add_run(db)
    values = [float((i * 37) % 101) for i in range(1024)]
    with db.transaction() as s:
        store.add_lines(s, run_id, [(i + 1, MetricLine(i, {"k": v})) for i, v in enumerate(values)])
    with db.transaction() as s:
        got = store.series(s, run_id, ["k"], 16)["k"]
        window = store.series(s, run_id, ["k"], 10, from_step=100, to_step=199)["k"]
    assert len(got) == 16  # aligned buckets of 64 steps
    for n, point in enumerate(got):
        bucket = values[n * 64 : (n + 1) * 64]
        assert (point.step, point.value) == (n * 64 + 63, bucket[-1])
        assert (point.min, point.max) == (min(bucket), max(bucket))
    # Buckets of 16 steps, the first and last cut by the range.
    assert [p.step for p in window] == [111, 127, 143, 159, 175, 191, 199]
    assert (window[0].min, window[0].max) == (min(values[100:112]), max(values[100:112]))
    assert window[-1].min == min(values[192:200])


def _reference(
    stored: dict[str, dict[int, float]], keys: list[str], max_points: int, lo: int, hi: int
) -> dict[str, list[tuple[int, str, str, str]]]:
    """Downsampling straight from the points: aligned buckets of ``store.width`` steps."""
    steps = [st for k in keys for st in stored.get(k, {})]
    out: dict[str, list[tuple[int, str, str, str]]] = {k: [] for k in keys}
    if not steps:
        return out
    lo, hi = max(lo, min(steps)), min(hi, max(steps))
    w = store.width(lo, hi, max_points)
    for key in keys:
        buckets: dict[int, list[tuple[int, float]]] = {}
        for step, value in sorted(stored.get(key, {}).items()):
            if lo <= step <= hi:
                buckets.setdefault(step // w, []).append((step, value))
        for pts in buckets.values():
            finite = [v for _, v in pts if not math.isnan(v)]
            lo_v, hi_v = (min(finite), max(finite)) if finite else (math.nan, math.nan)
            out[key].append((pts[-1][0], repr(pts[-1][1]), repr(lo_v), repr(hi_v)))
    return out


def _as_reference(got: dict[str, list[store.Point]]) -> dict[str, list[tuple[int, str, str, str]]]:
    return {
        k: [(p.step, repr(p.value), repr(p.min), repr(p.max)) for p in pts]
        for k, pts in got.items()
    }


def test_tier_reads_equal_downsampling_the_points_and_reingest_adds_nothing(db: Database) -> None:
    rng = random.Random(7)
    run_id = add_run(db)
    stored: dict[str, dict[int, float]] = {"a": {}, "b": {}, "sparse": {}}
    lines: list[tuple[int, MetricLine]] = []
    for i in range(6000):
        step = i * 3 if i < 3000 else 9000 + (i - 3000) * 301  # dense, then sparse up to ~912k
        values = {"a": rng.choice([rng.random(), math.nan, math.inf, -math.inf, rng.random()])}
        if i % 2:
            values["b"] = rng.uniform(-5, 5)
        if i % 97 == 0:
            values["sparse"] = math.nan if i % 3 == 0 else float(i)
        for k, v in values.items():
            stored[k].setdefault(step, v)
        lines.append((i + 1, MetricLine(step, values)))
    rng.shuffle(lines)  # a replica may read lines out of step order
    with db.transaction() as s:
        for n in range(0, len(lines), 500):
            store.add_lines(s, run_id, lines[n : n + 500])
    with db.transaction() as s:
        buckets_before = s.scalar(select(func.count()).select_from(MetricBucket))
        # Reading the log again, even with other values at the same steps, changes nothing.
        store.add_lines(s, run_id, lines[:800])
        store.add_lines(
            s,
            run_id,
            [(o, MetricLine(m.step, dict.fromkeys(m.values, 1.5))) for o, m in lines[:50]],
        )
        assert s.scalar(select(func.count()).select_from(MetricBucket)) == buckets_before
        for keys in (["a"], ["a", "b", "sparse", "missing"]):
            for max_points, lo, hi in [
                (10_000, 0, 10**9),  # every point
                (1000, 0, 10**9),  # from the coarsest tiers
                (500, 0, 8000),  # the finest tier as stored
                (100, 0, 9000),  # two stored buckets per answered one
                (300, 1234, 700_001),  # a range that cuts its first and last buckets
                (40, 5, 900_000),
                (2, 0, 10**9),  # wider than the coarsest tier
                (50, 4000, 4100),  # below the finest tier: from the points
            ]:
                got = store.series(s, run_id, keys, max_points, lo, hi)
                assert _as_reference(got) == _reference(stored, keys, max_points, lo, hi), (
                    keys,
                    max_points,
                    lo,
                    hi,
                )
                assert all(len(v) <= max_points for v in got.values())


def test_multi_key_reads_answer_each_key_as_alone_and_all_keys_by_name(db: Database) -> None:
    run_id = add_run(db)
    with db.transaction() as s:
        store.add_lines(
            s,
            run_id,
            [
                (i, MetricLine(i, {"z": i * 2.0, "a": -i * 1.0} if i % 4 else {"z": 0.0}))
                for i in range(5000)
            ],
        )
    with db.transaction() as s:
        both = store.series(s, run_id, ["z", "a", "nope"], 100)
        alone = {k: store.series(s, run_id, [k], 100)[k] for k in ("z", "a")}
        every = store.series(s, run_id, None, 100)
    assert list(both) == ["z", "a", "nope"] and both["nope"] == []
    assert both["z"] == alone["z"] and both["a"] == alone["a"]
    assert list(every) == ["a", "z"] and every["z"] == alone["z"]


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


def test_the_latest_table_follows_the_newest_step_with_nan_and_inf(db: Database) -> None:
    run_id = add_run(db)
    key, inf_key = "critic/score/mean", "critic/score/max"
    batches = [
        [(1, MetricLine(5, {key: 0.5, inf_key: math.inf}))],
        [(2, MetricLine(3, {key: 0.3, inf_key: 1.0}))],  # an older step arrives late
        [(3, MetricLine(7, {key: math.nan, inf_key: -math.inf}))],
        [(4, MetricLine(7, {key: 0.9}))],  # the same step again: the first value wins
    ]
    seen = []
    for batch in batches:
        with db.transaction() as s:
            store.add_lines(s, run_id, batch)
            seen.append(store.latest(s, run_id))
    assert seen[0] == {key: (5, 0.5), inf_key: (5, math.inf)}
    assert seen[1] == seen[0]
    step, value = seen[3][key]
    assert step == 7 and math.isnan(value) and seen[3][inf_key] == (7, -math.inf)
    with db.transaction() as s:
        row = s.scalars(
            select(MetricKey).where(MetricKey.run_id == run_id, MetricKey.key == key)
        ).one()
        assert (row.first_step, row.step) == (3, 7)
        assert store.keys_of(s, run_id) == [inf_key, key]
        assert list(store.series(s, run_id, None, 10)) == [inf_key, key]
        assert store.latest_of_runs(s, [run_id, "other"], [inf_key]) == {
            run_id: {inf_key: (7, -math.inf)}
        }


def test_duplicates_within_one_batch_keep_the_first_value_and_count_once(db: Database) -> None:
    run_id = add_run(db)
    lines = [(1, MetricLine(3, {"a": 1.0})), (2, MetricLine(3, {"a": 2.0, "b": 5.0}))]
    with db.transaction() as s:
        store.add_lines(s, run_id, lines)
        buckets = s.scalars(select(MetricBucket.count)).all()
        assert store.latest_of_runs(s, [run_id], ["a"]) == {run_id: {"a": (3, 1.0)}}
    assert points(db, run_id) == [(3, "a", 1.0), (3, "b", 5.0)]
    assert buckets == [1] * len(store.LEVELS) * 2


def test_no_lines_store_nothing(db: Database) -> None:
    run_id = add_run(db)
    with db.transaction() as s:
        assert store.add_lines(s, run_id, []) == 0
        assert store.keys_of(s, run_id) == []


def test_a_key_another_writer_added_meanwhile_is_looked_up_and_not_counted(db: Database) -> None:
    run_id = add_run(db)
    with db.transaction() as s:
        store.add_lines(s, run_id, [(1, MetricLine(1, {"a": 1.0}))])
        held = s.scalar(select(MetricKey.id).where(MetricKey.key == "a"))
        # As if "a" had been looked up as missing just before the other writer added it.
        ids, created = writes._add_keys(s, run_id, {"a", "b"})
    assert ids["a"] == held and set(ids) == {"a", "b"} and created == 1


def test_key_ids_of_a_deleted_run_are_never_given_to_another(db: Database) -> None:
    gone, kept = add_run(db, "gone"), add_run(db, "kept")
    with db.transaction() as s:
        store.add_lines(s, kept, [(1, MetricLine(1, {"a": 1.0}))])
        store.add_lines(s, gone, [(1, MetricLine(1, {"a": 7.0})), (2, MetricLine(2, {"a": 8.0}))])
    with db.transaction() as s:
        s.execute(Run.__table__.delete().where(Run.id == gone))  # its keys go with it
    new = add_run(db, "new")
    with db.transaction() as s:
        store.add_lines(s, new, [(1, MetricLine(5, {"a": 3.0}))])
        assert store.series(s, new, ["a"], 100)["a"] == [store.Point(5, 3.0, 3.0, 3.0)]
        assert store.recent(s, new, "a", 10) == [(5, 3.0)]


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


def test_a_step_line_ray_forwarded_in_two_parts_is_stored_whole(db: Database) -> None:
    # cpu-learn's step 28 as Ray's Jobs API gave it: cut mid-item, its rest lines later.
    run_id, ray = add_run(db), FakeRay()
    ray.log[run_id] = (DATA / "verl_cut_step_lines.log").open(encoding="utf-8", newline="").read()
    follower(db, ray, "one").tick()
    rewards = [(step, v) for step, key, v in points(db, run_id) if key == "critic/score/mean"]
    assert rewards == [(19, 0.6640625), (28, 0.6640625)]
    assert len({key for step, key, _ in points(db, run_id) if step == 28}) >= 141


def test_a_step_line_whose_rest_comes_in_a_later_read_is_stored_whole(db: Database) -> None:
    # The same log, its job log read up to each line in turn and then to the end: the cut line
    # is left to the next read until its worker says another line, whichever read it ends.
    text = (DATA / "verl_cut_step_lines.log").open(encoding="utf-8", newline="").read()
    lines = text.splitlines(keepends=True)
    for k in range(1, len(lines)):
        run_id, ray = add_run(db, f"r{k}"), FakeRay()
        f = follower(db, ray, "one")
        ray.log[run_id] = "".join(lines[:k])
        f.tick()
        ray.log[run_id] = text
        f.tick()
        rewards = [(step, v) for step, key, v in points(db, run_id) if key == "critic/score/mean"]
        assert rewards == [(19, 0.6640625), (28, 0.6640625)], k


def test_a_step_line_whose_worker_says_nothing_more_is_taken_after_a_wait(db: Database) -> None:
    run_id, ray = add_run(db), FakeRay()
    f = follower(db, ray, "one")
    f.await_rest_s = 0.3
    worker = "(FullyAsyncTrainer pid=42) "
    ray.log[run_id] = f"{worker}step:1 - critic/score/mean:0.5\n(Rollouter pid=43) idle\n"
    f.tick()
    assert points(db, run_id) == []  # its rest may be in the next read
    time.sleep(0.35)
    f.tick()
    assert [(s, v) for s, k, v in points(db, run_id) if k == "critic/score/mean"] == [(1, 0.5)]
    # Its worker's next line decides at once: the last line is whole.
    ray.log[run_id] += f"{worker}step:2 - critic/score/mean:0.7\n{worker}done\n"
    f.tick()
    assert [s for s, k, _ in points(db, run_id) if k == "critic/score/mean"] == [1, 2]


def test_a_collapsed_reward_stays_collapsed_past_the_window_until_it_is_back(db: Database) -> None:
    # cpu-learn at too high a learning rate: its answers left the format at step 4 and every
    # response scored 0 from then on, long past the window's 20 rewards (which alone have no
    # best); the verdict stands, given once, until the reward is back above half its best.
    run_id, ray = add_run(db), FakeRay()
    f = follower(db, ray, "one")

    def log(start: int, rewards: list[float]) -> None:
        ray.log[run_id] = ray.log.get(run_id, "") + "".join(
            f"step:{start + i} - critic/score/mean:{r}\n" for i, r in enumerate(rewards)
        )
        f.tick()

    log(0, [0.19, 0.27, 0.41, 0.5, 0.03, 0.0, 0.0])
    run, _ = read_run(db, run_id)
    assert run.health == "reward_collapse", run.health_reason
    assert run.health_reason == (
        "critic/score/mean fell from its best 0.5 (step 3) to 0 for 3 steps; "
        "every response scored 0"
    )
    for start in range(7, 57, 5):
        log(start, [0.0] * 5)
        run, reasons = read_run(db, run_id)
        assert run.health == "reward_collapse", (start, run.health_reason)
    assert sum("reward_collapse" in r for r in reasons) == 1, reasons
    log(57, [0.3, 0.35, 0.4])
    run, reasons = read_run(db, run_id)
    assert run.health == "ok" and reasons[-1] == "health ok: recovered", reasons


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


def test_the_follower_wakes_a_live_stream_for_metric_lines_and_events_not_for_other_text(
    db: Database,
) -> None:
    run_id, ray = add_run(db), FakeRay()
    woken: list[str] = []
    f = follower(db, ray, "one")
    f.notify = woken.append
    ray.log[run_id] = "loading the model\n"
    f.tick()
    assert woken == []  # text alone: nothing a stream carries
    ray.log[run_id] += "step:1 - actor/pg_loss:0.1\n"
    f.tick()
    assert woken == [run_id]  # a metric line
    ray.log[run_id] += "more text\n"
    f.tick()
    assert woken == [run_id]
    ray.log[run_id] += "step:2 - actor/pg_loss:nan\n" + "".join(f"text {i}\n" for i in range(3))
    f.tick()
    assert woken == [run_id, run_id]  # the line and the health event it brings
    run, reasons = read_run(db, run_id)
    assert run.health == "nan" and len(reasons) == 1


def test_the_follower_wakes_a_live_stream_for_an_event_that_comes_with_text_alone(
    db: Database,
) -> None:
    run_id, ray = add_run(db), FakeRay()
    woken: list[str] = []
    f = follower(db, ray, "one", stall_after_s=60)
    f.notify = woken.append
    ray.log[run_id] = "step:1 - a:1\n"
    f.tick()
    with db.transaction() as s:
        s.execute(update(RunLog).values(last_step_at=utcnow() - timedelta(seconds=120)))
    ray.log[run_id] += "still loading\n"
    f.tick()
    run, reasons = read_run(db, run_id)
    assert run.health == "stalled" and len(reasons) == 1
    assert woken == [run_id, run_id]  # the line, then the health event with no line
