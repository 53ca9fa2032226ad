"""Preemption through the loops, against an in-memory Ray: the submitter's round asks the victim
to stop at its next checkpoint, once; its save stops it, and it comes back QUEUED as the next
attempt of the same run."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import select

from service.cluster.inventory_cache import InventoryCache
from service.cluster.registry import ClusterHandle, Clusters
from service.cluster.spec import ClusterSpec
from service.loops.reconciler import Reconciler
from service.loops.submitter import Submitter
from service.recipes.base import Launch
from service.scheduling.admission import Quotas
from service.scheduling.preemption import Policy
from service.scheduling.shape import Group, ResourceShape
from service.store.db import Database
from service.store.lifecycle import checkpoint_saved
from service.store.models import Run, RunAttempt, RunEvent, RunLog, utcnow
from service.store.status import RunStatus
from tests.factories import add_run, read_run
from tests.fake_ray import FakeRay

ONE_NODE = {"n1": {"NPU": 8.0, "CPU": 8.0}}
ON = Policy()


def launch(checkpoints: bool) -> dict[str, object]:
    shape = ResourceShape(groups=(Group("job", 8, 0.0),), driver_cpus=0.1)
    return Launch(["true"], {}, shape, checkpoints=checkpoints).as_dict()


def running_low(db: Database, run_id: str = "lo", checkpoints: bool = True, **kw: object) -> None:
    long_ago = utcnow() - timedelta(hours=1)
    kw.setdefault("priority", 0)
    add_run(
        db,
        run_id,
        RunStatus.RUNNING,
        npus=8,
        launch=launch(checkpoints),
        submitted_at=long_ago,
        started_at=long_ago,
        **kw,
    )
    with db.transaction() as s:
        s.add(RunLog(run_id=run_id, last_step=5))


def loop(db: Database, ray: FakeRay, policy: Policy | None = ON) -> Submitter:
    busy = ray
    busy.used["n1"] = {"NPU": 8.0, "CPU": 0.1}
    return Submitter(
        db, busy, InventoryCache(busy, 0.0), Quotas(), "me", 30.0, 10, preemption=policy
    )


def test_a_high_run_preempts_a_low_one_once_and_it_comes_back_as_its_next_attempt(
    db: Database,
) -> None:
    ray = FakeRay(ONE_NODE)
    ray.set_status("lo", "RUNNING")
    running_low(db)
    add_run(db, "hi", RunStatus.QUEUED, priority=2, npus=8)
    submitter = loop(db, ray)
    submitter.tick()
    high, _ = read_run(db, "hi")
    assert high.queue_reason == (
        "preempting lo (lower priority): they stop at their next checkpoint, within 300 s"
    )
    submitter.tick()  # a second round (or replica) decides nothing new: the victim is stopping
    victim, reasons = read_run(db, "lo")
    assert victim.status == RunStatus.RUNNING and victim.yield_by is not None
    preempted = [r for r in reasons if r.startswith("preempted for run hi (high)")]
    assert preempted == [
        "preempted for run hi (high): asked to stop at its next checkpoint within 300 s "
        "(5 steps since its last save)"
    ]
    high, _ = read_run(db, "hi")
    assert high.status == RunStatus.QUEUED
    assert high.queue_reason == "waits for lo to stop (at a checkpoint, or in time)"
    # Its next save stops it; Ray reports the job stopped; it is QUEUED as attempt 2.
    with db.transaction() as s:
        run = s.get(Run, "lo")
        assert run is not None
        checkpoint_saved(s, run, 6, logged=6)
    reconciler = Reconciler(db, ray)
    reconciler.tick()
    reconciler.tick()
    victim, reasons = read_run(db, "lo")
    assert victim.status == RunStatus.QUEUED and victim.attempt == 2
    assert victim.resume == "checkpoint"
    assert reasons[-1] == (
        "preempted for run hi (high): stopped at checkpoint step 6, 0 steps lost; "
        "attempt 2 waits to resume from its checkpoint"
    )
    with db.read() as s:
        attempts = s.scalars(select(RunAttempt).where(RunAttempt.run_id == "lo")).all()
        kinds = s.scalars(select(RunEvent.kind).where(RunEvent.run_id == "lo")).all()
    assert [(a.n, a.status) for a in attempts] == [(1, "STOPPED")]
    assert "preempted" in kinds and "checkpoint" in kinds
    # The high run is admitted now that the node is free.
    ray.used.clear()
    submitter.tick()
    assert read_run(db, "hi")[0].status == RunStatus.SUBMITTED


def test_with_preemption_off_or_sparing_runs_that_save_nothing_nothing_is_stopped(
    db: Database,
) -> None:
    ray = FakeRay(ONE_NODE)
    running_low(db, "nock", checkpoints=False)
    with db.transaction() as s:  # a checkpoint line in its log (another team's job can write it)
        run = s.get(Run, "nock")
        assert run is not None
        checkpoint_saved(s, run, 900_000, 900_001)
    add_run(db, "hi", RunStatus.QUEUED, priority=2, npus=8)
    loop(db, ray, policy=Policy(without_checkpoints=False)).tick()
    victim, _ = read_run(db, "nock")
    assert victim.yield_by is None and victim.stop_requested_at is None
    high, _ = read_run(db, "hi")
    assert high.queue_reason is not None
    assert "not preempted: nock saves no checkpoints: never preempted" in high.queue_reason
    # The operator's default: saving nothing exempts nothing (and the forged save is no save).
    loop(db, ray).tick()
    assert read_run(db, "nock")[0].yield_by is not None
    running_low(db, "lo")
    loop(db, ray, policy=None).tick()
    assert read_run(db, "lo")[0].yield_by is None


def test_a_run_admitted_lately_is_not_preempted_and_the_waiting_run_says_so(db: Database) -> None:
    ray = FakeRay(ONE_NODE)
    running_low(db, "fresh")
    with db.transaction() as s:
        run = s.get(Run, "fresh")
        assert run is not None
        run.submitted_at = utcnow() - timedelta(seconds=30)
    add_run(db, "hi", RunStatus.QUEUED, priority=2, npus=8)
    loop(db, ray).tick()
    assert read_run(db, "fresh")[0].yield_by is None
    reason = read_run(db, "hi")[0].queue_reason or ""
    assert "not preempted: fresh admitted 3" in reason and "(not preempted before 600 s)" in reason


def test_across_clusters_a_high_run_preempts_on_the_cluster_that_can_make_its_room(
    db: Database,
) -> None:
    # Cluster a is full of a run that may not be preempted, cluster b of a low one that may.
    rays = {name: FakeRay(ONE_NODE) for name in ("a", "b")}
    for ray in rays.values():
        ray.used["n1"] = {"NPU": 8.0, "CPU": 0.1}
    clusters = Clusters(
        [
            ClusterHandle(
                ClusterSpec(name=name, address=f"http://{name}:8265", accelerator="NPU"),
                ray,
                InventoryCache(ray, 0.0),
            )
            for name, ray in rays.items()
        ]
    )
    running_low(db, "peer", priority=2, cluster="a")
    running_low(db, "lo", cluster="b")
    add_run(db, "hi", RunStatus.QUEUED, priority=2, npus=8)
    submitter = Submitter(db, clusters, None, Quotas(), "me", 30.0, 10, preemption=ON)
    submitter.tick()
    assert read_run(db, "peer")[0].yield_by is None
    victim, reasons = read_run(db, "lo")
    preempted = [r for r in reasons if r.startswith("preempted for run hi (high)")]
    assert victim.yield_by is not None and len(preempted) == 1
    assert read_run(db, "hi")[0].queue_reason == (
        "preempting lo on b (lower priority): they stop at their next checkpoint, within 300 s"
    )
    submitter.tick()  # decided once: the next round waits for lo
    assert [r for r in read_run(db, "lo")[1] if r.startswith("preempted for")] == preempted


def test_a_plan_says_what_preemption_would_do_to_the_run(db_url: str) -> None:
    from fastapi.testclient import TestClient

    from service.app import create_app
    from tests.conftest import make_settings

    settings = make_settings(db_url, "http://127.0.0.1:9", run_loops=False, preemption="on")
    with TestClient(create_app(settings)) as api:

        def plan(**spec: object) -> dict[str, object]:
            body = {"recipe": "tiny-grpo", "total_rollout_steps": 16} | spec
            answer = api.post("/runs", params={"dry_run": "true"}, json=body)
            assert answer.status_code == 200, answer.text
            return dict(answer.json()["plan"])

        assert plan(priority="low")["preemption"] == (
            "saves no checkpoints: may be preempted, losing every step since its start"
        )
        assert str(plan(priority="low", save_every=1)["preemption"]).startswith(
            "may be preempted by a higher priority: asked to stop at its next checkpoint"
        )
        assert plan(priority="high")["preemption"] == "priority high: never preempted"
