"""Many runs followed at once: a tick's cost in statements, leases shared and handed over."""

from __future__ import annotations

import asyncio
import threading
import time
from datetime import datetime

import pytest
from sqlalchemy import func, select

from service.loops.follower import Follower
from service.metrics import logcopy, store
from service.metrics.broker import Broker, Cursor, Item, Read
from service.metrics.health import HealthRules
from service.metrics.log_readers import TailReader
from service.metrics.parse import MetricLine
from service.store.db import Database
from service.store.models import MetricPoint, RunLog
from tests.factories import add_run, read_run, statements
from tests.fake_ray import FakeRay


def make_runs(db: Database, ray: FakeRay, n: int) -> list[str]:
    ids = [add_run(db, f"r{i:04d}") for i in range(n)]
    for run_id in ids:
        ray.set_status(run_id, "RUNNING")
        ray.log[run_id] = "step:1 - a:1\n"
    return ids


def follower(db: Database, ray: FakeRay, owner: str, lease_s: float = 30, **kw: int) -> Follower:
    return Follower(db, ray, owner, lease_s, 100_000, HealthRules(), **kw)  # type: ignore[arg-type]


def test_a_tick_stores_its_runs_in_one_transaction_per_batch_and_renews_leases_at_once(
    db: Database,
) -> None:
    ray = FakeRay()
    make_runs(db, ray, 120)
    f = follower(db, ray, "one", batch=50, claim_new=1000)
    with statements(db, upper=True) as seen:
        f.tick()
    begins = [s for s in seen if s.startswith("BEGIN")]
    lease_updates = [s for s in seen if s.startswith("UPDATE RUN_LOGS SET LEASE_OWNER")]
    locks = [
        s for s in seen if s.startswith("SELECT RUN_LOGS.RUN_ID, RUN_LOGS.LOG_OFFSET, RUN_LOGS.")
    ]
    row_updates = [s for s in seen if s.startswith(("UPDATE RUNS SET", "UPDATE RUN_LOGS SET LOG"))]
    per_run = [s for s in seen if "METRIC_" in s]  # the metric store's own statements
    assert len(begins) <= 4  # the claim, then one transaction per batch of 50
    assert len(lease_updates) == 1
    assert len(locks) == 3  # each batch's rows locked in one query
    assert len(row_updates) == 6  # each batch's run and run_log rows written together
    assert len(seen) - len(per_run) < 30
    with db.read() as s:
        assert s.scalar(select(func.count()).select_from(MetricPoint)) == 120


def test_a_run_taken_over_between_read_and_store_is_left_and_its_batch_is_stored(
    db: Database,
) -> None:
    ray = FakeRay()
    ids = make_runs(db, ray, 10)
    stolen = ids[3]

    class Stealing(TailReader):
        def read(
            self, run_id: str, offset: int, ended_at: datetime | None
        ) -> tuple[str | None, bool]:
            if run_id == stolen:
                with db.transaction() as s:
                    runlog = s.get(RunLog, run_id)
                    assert runlog is not None
                    runlog.lease_owner = "two"
            return super().read(run_id, offset, ended_at)

    f = Follower(db, ray, "one", 30, 100_000, HealthRules(), reader=Stealing(ray))
    f.tick()
    with db.read() as s:
        offsets = dict(s.execute(select(RunLog.run_id, RunLog.log_offset)).all())
    assert offsets.pop(stolen) == 0
    assert set(offsets.values()) == {len("step:1 - a:1\n")}


def test_a_replica_starts_following_at_most_claim_new_unheld_runs_a_tick(db: Database) -> None:
    ray = FakeRay()
    make_runs(db, ray, 25)
    one, two = follower(db, ray, "one", claim_new=10), follower(db, ray, "two", claim_new=10)
    one.tick()
    two.tick()
    one.tick()
    with db.read() as s:
        owners = dict(
            s.execute(select(RunLog.lease_owner, func.count()).group_by(RunLog.lease_owner)).all()
        )
    assert owners == {"one": 15, "two": 10}


def test_two_replicas_follow_every_run_exactly_once_and_a_dead_ones_runs_move_within_the_lease(
    db: Database,
) -> None:
    ray = FakeRay()
    ids = make_runs(db, ray, 40)
    lease_s = 2.0
    replicas = {name: follower(db, ray, name, lease_s, claim_new=7) for name in ("one", "two")}
    alive = {name: threading.Event() for name in replicas}
    for flag in alive.values():
        flag.set()
    stop = threading.Event()
    lines = {run_id: 1 for run_id in ids}

    errors: list[Exception] = []

    def ticking(name: str) -> None:
        while not stop.is_set():
            try:
                if alive[name].is_set():
                    replicas[name].tick()
            except Exception as exc:
                errors.append(exc)
            time.sleep(0.05)

    threads = [threading.Thread(target=ticking, args=(n,)) for n in replicas]
    for t in threads:
        t.start()
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            for run_id in ids:  # the jobs print on
                lines[run_id] += 1
                ray.log[run_id] += f"step:{lines[run_id]} - a:{lines[run_id]}\n"
            with db.read() as s:
                owners = set(s.scalars(select(RunLog.lease_owner)))
            if owners == {"one", "two"}:
                break
            time.sleep(0.1)
        assert owners == {"one", "two"}, "the replicas share the runs"
        alive["one"].clear()  # dies: no more ticks, no release
        died = time.monotonic()
        while time.monotonic() - died < 60:
            with db.read() as s:
                owners = set(s.scalars(select(RunLog.lease_owner)))
            if owners == {"two"}:
                break
            time.sleep(0.05)
        handed_over_s = time.monotonic() - died
        assert owners == {"two"}
        assert handed_over_s < lease_s + 10  # the lease, and a margin for a loaded machine
        for run_id in ids:
            ray.set_status(run_id, "SUCCEEDED")
        time.sleep(1.0)
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    with db.read() as s:
        for run_id in ids:
            # Read exactly once: the kept copy is the log so far (no line twice, none left
            # out), with one point per line.
            stored = logcopy.tail(s, run_id, None)
            assert len(stored) > len("step:1 - a:1\n")
            assert stored == ray.log[run_id][: len(stored)]
            points = s.scalar(select(func.count()).where(MetricPoint.run_id == run_id))
            assert points == stored.count("\n")
    assert not errors


class CountingBroker(Broker):
    reads = 0

    def _read(self, run_id: str, cursor: Cursor) -> Read:
        self.reads += 1
        return super()._read(run_id, cursor)


def test_idle_live_streams_cost_no_read_per_poll_and_a_write_without_notify_arrives(
    db: Database,
) -> None:
    ids = [add_run(db, f"idle-{i}") for i in range(5)]
    broker = CountingBroker(db, poll_s=0.05)

    async def scenario() -> list[Item]:
        got: list[Item] = []

        async def collect(run_id: str) -> None:
            async for item, _ in broker.subscribe(run_id, Cursor()):
                got.append(item)

        tasks = [asyncio.create_task(collect(run_id)) for run_id in ids]
        await asyncio.sleep(1.0)  # 20 polls
        idle_reads = broker.reads
        # Another replica's write: no notify here, only the poller can see it.
        with db.transaction() as s:
            store.add_lines(s, ids[0], [(10, MetricLine(1, {"a": 1.0}))])
        deadline = time.monotonic() + 10
        while not got and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await broker.close()
        assert idle_reads <= 3 * len(ids)  # the first reads of each stream, then none
        return got

    got = asyncio.run(scenario())
    assert [(i.kind, i.data["step"]) for i in got] == [("metrics", 1)]


def test_a_log_within_the_kept_tail_is_appended_without_a_delete(db: Database) -> None:
    run_id = add_run(db)
    with statements(db, upper=True) as seen, db.transaction() as s:
        logcopy.append(s, run_id, 0, "line\n" * 10, keep_chars=1000)
    assert not [q for q in seen if q.startswith("DELETE")]
    with db.transaction() as s:
        logcopy.append(s, run_id, 50, "x" * 2000 + "\n", keep_chars=1000)
        assert logcopy.tail(s, run_id, None) == "x" * 2000 + "\n"


def test_new_lines_without_a_reward_leave_the_reward_verdict_without_reading_its_history(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    ray = FakeRay()
    run_id = add_run(db)
    rewards = [0.2, 0.6, 0.9, 0.8, 0.3, 0.2, 0.1]
    ray.set_status(run_id, "RUNNING")
    ray.log[run_id] = "".join(f"step:{i} - critic/score/mean:{r}\n" for i, r in enumerate(rewards))
    f = follower(db, ray, "one")
    f.tick()
    run, _ = read_run(db, run_id)
    assert run.health == "reward_collapse"
    histories: list[str] = []
    real = store.recent
    monkeypatch.setattr(store, "recent", lambda *a: histories.append(a[2]) or real(*a))
    ray.log[run_id] += "step:7 - actor/pg_loss:0.5\n"
    f.tick()
    run, _ = read_run(db, run_id)
    assert run.health == "reward_collapse"
    assert histories == []
    ray.log[run_id] += "step:8 - critic/score/mean:0.95\n"
    f.tick()
    run, _ = read_run(db, run_id)
    assert histories == ["critic/score/mean"]
    assert run.health == "ok"
