"""A run's failure is settled once it has ended and its log is read: the class from the log
(with the decisive lines and their offsets in the kept log), or from how it ended; run.failed
subscribers hear of it with the class."""

from __future__ import annotations

from datetime import timedelta
from typing import cast

from fastapi.testclient import TestClient
from sqlalchemy import select

from service.cluster.ray_jobs import RayJobs
from service.loops.follower import Follower
from service.metrics.health import HealthRules
from service.metrics.log_readers import WholeLogReader
from service.store.db import Database
from service.store.lifecycle import transition
from service.store.models import Run, WebhookDelivery, utcnow
from service.store.status import RunStatus
from tests.factories import add_run, add_webhook
from tests.test_limits import GrowingLog

LOG = (
    "step:1 - critic/score/mean:0.25\n"
    "(WorkerDict pid=31, ip=10.0.0.2) RuntimeError: NPU out of memory. Tried to allocate 2.00 GiB"
    " (NPU 3; 60.96 GiB total capacity; 58.10 GiB already allocated)\n"
    "ray.exceptions.ActorDiedError: The actor died unexpectedly before finishing this task.\n"
)


def _follow(db: Database, log: str) -> None:
    growing = GrowingLog()
    growing.text = log
    ray = cast(RayJobs, growing)
    Follower(db, ray, "me", 30.0, 10_000, HealthRules(), reader=WholeLogReader(ray)).tick()


def test_a_failed_run_s_class_and_evidence_come_from_its_log(api: TestClient, db_url: str) -> None:
    db = Database(db_url)
    add_webhook(db, ["run.failed"], team="t")
    add_run(db, "r1", RunStatus.RUNNING)
    with db.transaction() as s:
        run = s.get(Run, "r1")
        assert run is not None
        transition(s, run, RunStatus.FAILED, "the job failed")
        run.ended_at = utcnow() - timedelta(minutes=1)  # long enough ago for the final read
    with db.read() as s:  # run.failed waits for the class
        assert s.scalar(select(WebhookDelivery.id)) is None
    _follow(db, LOG)
    failure = api.get("/runs/r1").json()["failure"]
    assert failure["class"] == "npu_oom"
    assert "gpu_memory_utilization" in failure["hint"] or "micro_batch" in failure["hint"]
    (evidence,) = failure["evidence"]
    kept = api.get("/runs/r1/logs", params={"ansi": True}).text
    assert kept[evidence["offset"] :].startswith(evidence["line"])
    with db.read() as s:
        delivery = s.scalars(select(WebhookDelivery)).one()
    assert delivery.event_type == "run.failed"
    assert delivery.payload["failure"]["class"] == "npu_oom"
    db.dispose()


def test_how_a_run_ended_names_its_class_when_the_log_cannot(api: TestClient, db_url: str) -> None:
    db = Database(db_url)
    add_run(db, "queued", RunStatus.QUEUED)
    assert api.post("/runs/queued/cancel").json()["status"] == "CANCELLED"
    assert api.get("/runs/queued").json()["failure"]["class"] == "cancelled"
    for run_id, asked in (("asked", True), ("outside", False)):
        add_run(db, run_id, RunStatus.RUNNING)
        with db.transaction() as s:
            run = s.get(Run, run_id)
            assert run is not None
            run.stop_requested_at = utcnow() if asked else None
            transition(s, run, RunStatus.STOPPED, "the job was stopped")
            run.ended_at = utcnow() - timedelta(minutes=1)
        _follow(db, "step:1 - a:1.0\n")
    assert api.get("/runs/asked").json()["failure"]["class"] == "cancelled"
    assert api.get("/runs/outside").json()["failure"]["class"] == "stopped_outside"
    add_run(db, "ok", RunStatus.RUNNING)
    with db.transaction() as s:
        run = s.get(Run, "ok")
        assert run is not None
        transition(s, run, RunStatus.SUCCEEDED, "done")
        run.ended_at = utcnow() - timedelta(minutes=1)
    _follow(db, "step:1 - a:1.0\n")
    assert api.get("/runs/ok").json()["failure"] is None
    db.dispose()
