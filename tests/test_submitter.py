"""The submitter, one tick at a time against an in-memory Ray: admission, exactly-once, refusals."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from service.cluster.inventory_cache import InventoryCache
from service.cluster.ray_jobs import RayRejected, RayUnavailable
from service.loops.submitter import Submitter
from service.scheduling.admission import Quotas
from service.store.db import Database
from service.store.lifecycle import transition
from service.store.models import Run
from service.store.status import RunStatus
from tests.factories import add_run, read_run
from tests.fake_ray import FakeRay

TWO_NODES = {"n1": {"NPU": 8.0, "CPU": 8.0}, "n2": {"NPU": 8.0, "CPU": 8.0}}


def submitter(db: Database, ray: FakeRay, quotas: Quotas | None = None) -> Submitter:
    return Submitter(db, ray, InventoryCache(ray, 0.0), quotas or Quotas(), "me", 30.0, 10)


def first_round(db: Database, ray: FakeRay) -> tuple[Run, list[str]]:
    """Queue run r1, tick once; the run as stored and its events."""
    add_run(db, "r1", RunStatus.QUEUED)
    submitter(db, ray).tick()
    return read_run(db, "r1")


def test_a_queued_run_that_fits_goes_to_ray_once_under_its_own_id(db: Database) -> None:
    ray = FakeRay(TWO_NODES)
    add_run(db, "r1", RunStatus.QUEUED, npus=8)
    loop = submitter(db, ray)
    loop.tick()
    loop.tick()
    assert [s["submission_id"] for s in ray.submitted] == ["r1"]
    assert ray.submitted[0]["runtime_env"]["py_modules"] == ["gcs://_ray_pkg_jobs.zip"]
    run, reasons = read_run(db, "r1")
    assert run.status == RunStatus.SUBMITTED and run.ray_status == "PENDING"
    assert run.claim_owner == "me" and reasons == ["submitted to Ray"]


def test_a_retry_that_ray_already_has_counts_as_submitted(db: Database) -> None:
    ray = FakeRay(TWO_NODES)
    ray.set_status("r1", "RUNNING")  # a replica died after Ray took the job
    run, reasons = first_round(db, ray)
    assert ray.submitted == [] and run.status == RunStatus.SUBMITTED
    assert reasons == ["already on Ray (a retried submission)"]


def test_a_job_ray_refuses_fails_with_ray_s_words(db: Database) -> None:
    ray = FakeRay(TWO_NODES)
    ray.fail("submit", RayRejected("Ray refused (400): bad runtime_env"))
    run, reasons = first_round(db, ray)
    assert run.status == RunStatus.FAILED
    assert run.ray_message == "Ray refused the job: Ray refused (400): bad runtime_env"
    assert reasons == ["Ray refused the job: Ray refused (400): bad runtime_env"]


@pytest.mark.parametrize("call", ["submit", "cluster_status"])
def test_ray_unavailable_leaves_the_run_queued_unclaimed_and_the_next_tick_submits(
    db: Database, call: str
) -> None:
    ray = FakeRay(TWO_NODES)
    ray.fail(call, RayUnavailable("no answer"))
    with pytest.raises(RayUnavailable):
        first_round(db, ray)
    run, _ = read_run(db, "r1")
    assert run.status == RunStatus.QUEUED and run.claim_owner is None and ray.submitted == []
    submitter(db, ray).tick()
    assert read_run(db, "r1")[0].status == RunStatus.SUBMITTED


def test_a_run_cancelled_while_its_submission_was_in_flight_is_stopped_on_ray(
    db: Database,
) -> None:
    ray = FakeRay(TWO_NODES)
    add_run(db, "r1", RunStatus.QUEUED)
    submit = ray.submit

    def submit_while_a_cancel_lands(**kwargs: object) -> bool:
        with db.transaction() as s:
            run = s.get(Run, "r1")
            assert run is not None
            transition(s, run, RunStatus.CANCELLED, "cancelled before submission")
        return submit(**kwargs)  # type: ignore[arg-type]

    ray.submit = submit_while_a_cancel_lands  # type: ignore[method-assign]
    submitter(db, ray).tick()
    assert ray.stopped == ["r1"] and ray.jobs["r1"].status == "STOPPED"
    assert read_run(db, "r1")[0].status == RunStatus.CANCELLED


def test_waiting_runs_keep_the_reason_of_the_round_and_get_cluster_shows_it(
    api: TestClient, db_url: str
) -> None:
    """``GET /cluster`` decides nothing: its reasons are the stored ``queue_reason``s."""
    db = Database(db_url)
    ray = FakeRay({"n1": {"NPU": 8.0, "CPU": 8.0}})
    ids = [
        api.post("/runs", json={"recipe": "test-script", "npus": 8, **extra}).json()["id"]
        for extra in ({}, {"team": "vision"}, {"npus": 16, "priority": "low"})
    ]
    waiting = api.get("/cluster").json()["queue"]
    assert [r["reason"] for r in waiting] == [None, None, None]  # no round has run yet
    submitter(db, ray, Quotas({"vision": 4})).tick()
    first, over_quota, too_big = (api.get(f"/runs/{i}").json() for i in ids)
    assert first["status"] == "SUBMITTED"
    assert over_quota["queue_reason"].startswith("quota: team vision holds 0 of its 4")
    assert too_big["queue_reason"] == "capacity: can never fit this cluster's nodes"
    view = api.get("/cluster").json()["queue"]
    assert [(r["id"], r["reason"]) for r in view] == [
        (ids[1], over_quota["queue_reason"]),
        (ids[2], too_big["queue_reason"]),
    ]
    db.dispose()
