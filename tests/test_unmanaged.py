"""Jobs on the cluster that are no runs of the service, against an in-memory Ray: what Ray's
state says they hold, how they are shown, counted in admission, recorded and (by setting)
stopped."""

from __future__ import annotations

from dataclasses import replace

from fastapi.testclient import TestClient
from sqlalchemy import select

from service.app import create_app
from service.cluster.inventory_cache import InventoryCache
from service.cluster.ray_jobs import RayUnavailable
from service.cluster.registry import Clusters
from service.loops.submitter import Submitter
from service.loops.unmanaged import UnmanagedJobs
from service.scheduling.admission import Quotas, decide
from service.scheduling.outside import entrypoint_head, from_state, held_outside, unmanaged
from service.store.db import Database
from service.store.models import AuditEntry
from service.store.status import RunStatus
from service.store.tokens import create as create_token
from tests.conftest import make_settings
from tests.factories import add_run, read_run
from tests.fake_ray import FakeRay
from tests.test_admission import nodes, q

TWO_NODES = {"n1": {"NPU": 8.0, "CPU": 8.0}, "n2": {"NPU": 8.0, "CPU": 8.0}}


def test_an_entrypoint_is_shown_short_without_control_characters_or_env_values() -> None:
    head = entrypoint_head("TOKEN=s3cr3t env KEY=v python3\x1b[31m -c 'x' --lr=0.1 a.b=2\n")
    assert head == "TOKEN=… env KEY=… python3 [31m -c 'x' --lr=0.1 a.b=2"
    long = entrypoint_head("x" * 500)
    assert len(long) == 160 and long.endswith("…")


def test_what_a_job_holds_comes_from_its_supervisor_its_actors_and_its_placement_groups() -> None:
    jobs = [
        {"type": "SUBMISSION", "submission_id": "s1", "job_id": "01", "status": "RUNNING"},
        {"type": "SUBMISSION", "submission_id": "s2", "job_id": "02", "status": "SUCCEEDED"},
        {"type": "DRIVER", "job_id": "03", "status": "RUNNING", "entrypoint": "python x.py"},
        {"type": "DRIVER", "job_id": "04", "status": "SUCCEEDED"},
    ]
    actors = [
        {"name": "_ray_internal_job_actor_s1", "job_id": "ff", "node_id": "a",
         "required_resources": {"NPU": 1.0, "CPU": 0.5}},
        {"name": "", "job_id": "03", "node_id": "b", "required_resources": {"NPU": 2.0}},
        {"name": "", "job_id": "03", "node_id": "b", "required_resources": {"NPU": 9.0},
         "placement_group_id": "pg"},  # its bundle counts, not the actor
        {"name": "", "job_id": "01", "node_id": "a", "state": "DEAD",
         "required_resources": {"NPU": 9.0}},
    ]  # fmt: skip
    groups = [
        {"creator_job_id": "01", "state": "CREATED",
         "bundles": [{"node_id": "b", "unit_resources": {"NPU": 4.0, "CPU": 1.0}}]},
        {"creator_job_id": "03", "state": "CREATED",
         "bundles": [{"node_id": "b", "unit_resources": {"NPU": 1.0}}]},
    ]  # fmt: skip
    seen = {j.id: j for j in from_state(jobs, actors, groups)}
    assert set(seen) == {"s1", "03"}
    assert seen["s1"].held == {"a": {"NPU": 1.0, "CPU": 0.5}, "b": {"NPU": 4.0, "CPU": 1.0}}
    assert seen["03"].type == "DRIVER" and seen["03"].total() == {"NPU": 3.0}
    assert held_outside(seen.values()) == {"NPU": 8.0, "CPU": 1.5}
    assert held_outside(seen.values(), {"a"}) == {"NPU": 1.0, "CPU": 0.5}


def test_a_job_with_a_run_s_id_is_the_run_and_any_other_is_unmanaged(db: Database) -> None:
    ray = FakeRay(TWO_NODES)
    add_run(db, "r1", RunStatus.RUNNING)
    ray.set_status("r1", "RUNNING")
    ray.outside_job("raw", {"n1": {"NPU": 4.0}})
    ray.outside_job("0a000000", {"n2": {"NPU": 2.0}}, kind="DRIVER")
    jobs = InventoryCache(ray, 0.0).get().jobs
    with db.read() as s:
        assert sorted(j.id for j in unmanaged(s, jobs)) == ["0a000000", "raw"]


def test_admission_s_own_account_counts_what_jobs_outside_hold() -> None:
    # Ray's "available" lags and still shows the nodes free: the account must keep the run out.
    assert decide([q("r1", 8, 8)], [], nodes(8, 8), Quotas()).admit == ["r1"]
    d = decide([q("r1", 8, 8)], [], nodes(8, 8), Quotas(), outside={"NPU": 4.0})
    assert d.admit == []
    assert d.reasons["r1"] == (
        "capacity: needs 2 x 8 NPU, each on one node; admitted runs hold 0 and jobs outside "
        "rlrun hold 4 of 16 NPU"
    )


def test_the_submitter_counts_an_unmanaged_job_even_while_ray_shows_its_npus_free(
    db: Database,
) -> None:
    ray = FakeRay(TWO_NODES)
    ray.outside_job("raw", {"n1": {"NPU": 4.0}})
    ray.used.clear()  # Ray's per-node usage has not caught up yet
    add_run(db, "r1", RunStatus.QUEUED, npus=8)
    add_run(db, "r2", RunStatus.QUEUED, npus=8)
    Submitter(db, ray, InventoryCache(ray, 0.0), Quotas(), "me", 30.0, 10).tick()
    assert [s["submission_id"] for s in ray.submitted] == ["r1"]
    run, _ = read_run(db, "r2")
    assert "jobs outside rlrun hold 4" in (run.queue_reason or "")


def audit_rows(db: Database) -> list[tuple[str, str | None]]:
    with db.read() as s:
        return [(a.action, a.target) for a in s.scalars(select(AuditEntry).order_by(AuditEntry.id))]


def test_each_unmanaged_job_is_recorded_once_and_stopped_only_by_setting(db: Database) -> None:
    ray = FakeRay(TWO_NODES)
    add_run(db, "r1", RunStatus.RUNNING)
    ray.set_status("r1", "RUNNING")
    ray.outside_job("raw", {"n1": {"NPU": 4.0}}, start_time_ms=1)
    ray.outside_job("0a000000", {"n2": {"NPU": 2.0}}, kind="DRIVER", start_time_ms=1)
    inventory = InventoryCache(ray, 0.0)
    UnmanagedJobs(db, ray, inventory).tick()
    UnmanagedJobs(db, ray, inventory).tick()  # another replica, or a restart: no second row
    assert ray.stopped == []
    assert audit_rows(db) == [("job.unmanaged", "raw"), ("job.unmanaged", "0a000000")]

    ray.stop_ends_job = False  # the job takes its grace period to exit
    loop = UnmanagedJobs(db, ray, inventory, stop_after_s=0.0)
    loop.tick()
    loop.tick()
    assert ray.stopped == ["raw"]  # a driver cannot be stopped through the Jobs API
    assert audit_rows(db)[2:] == [("job.stopped_unmanaged", "raw")]
    UnmanagedJobs(db, ray, inventory, stop_after_s=0.0).tick()
    assert len(audit_rows(db)) == 3


def test_a_job_younger_than_the_grace_is_left_running(db: Database) -> None:
    ray = FakeRay(TWO_NODES)
    ray.outside_job("raw", {"n1": {"NPU": 4.0}}, start_time_ms=10**15)  # far in the future
    UnmanagedJobs(db, ray, InventoryCache(ray, 0.0), stop_after_s=60.0).tick()
    assert ray.stopped == [] and audit_rows(db) == [("job.unmanaged", "raw")]


def test_cluster_lists_unmanaged_jobs_with_their_commands_for_admins_only(db_url: str) -> None:
    settings = make_settings(db_url, "http://127.0.0.1:9", run_loops=False, auth="on")
    ray = FakeRay(TWO_NODES)
    ray.outside_job("raw", {"n1": {"NPU": 4.0}}, entrypoint="python3 steal.py --all")
    with TestClient(create_app(settings)) as client:
        services = client.app.state.services  # type: ignore[attr-defined]
        client.app.state.services = replace(services, clusters=Clusters.single(ray))  # type: ignore[attr-defined]
        with Database(db_url).transaction() as s:
            admin = create_token(s, "root", "ops", "admin")[1]
            member = create_token(s, "ann", "vision", "member")[1]
        seen = {}
        for name, token in (("admin", admin), ("member", member)):
            view = client.get("/cluster", headers={"Authorization": f"Bearer {token}"}).json()
            seen[name] = view["unmanaged"]
    assert seen["admin"][0]["entrypoint"] == "python3 steal.py --all"
    assert seen["member"][0]["entrypoint"] is None
    assert seen["member"][0]["resources"] == {"NPU": 4.0} and seen["member"][0]["id"] == "raw"


def test_each_node_shows_its_address_and_who_holds_what_there(db_url: str) -> None:
    settings = make_settings(db_url, "http://127.0.0.1:9", run_loops=False, auth="on")
    ray = FakeRay(TWO_NODES)
    ray.outside_job("r1", {"n1": {"NPU": 2.0}})  # the runs' jobs, as Ray reports them
    ray.outside_job("r2", {"n1": {"NPU": 3.0}, "n2": {"NPU": 1.0}})
    ray.outside_job("raw", {"n2": {"NPU": 4.0}})
    with TestClient(create_app(settings)) as client:
        services = client.app.state.services  # type: ignore[attr-defined]
        client.app.state.services = replace(services, clusters=Clusters.single(ray))  # type: ignore[attr-defined]
        db = Database(db_url)
        add_run(db, "r1", RunStatus.RUNNING, team="vision", name="ours")
        add_run(db, "r2", RunStatus.RUNNING, team="nlp", name="theirs")
        with db.transaction() as s:
            member = create_token(s, "ann", "vision", "member")[1]
        view = client.get("/cluster", headers={"Authorization": f"Bearer {member}"}).json()
    nodes = {n["id"]: n for n in view["nodes"]}
    assert nodes["n1"]["address"] == "10.0.0.1" and nodes["n1"]["hostname"] == "host-n1"
    held = {(n, x["kind"], x["id"], x["name"], x["team"], x["resources"]["NPU"])
            for n, node in nodes.items() for x in node["holders"]}  # fmt: skip
    assert held == {
        ("n1", "run", "r1", "ours", "vision", 2.0),
        ("n1", "run", "r2", None, "nlp", 3.0),  # another team's run: no name
        ("n2", "run", "r2", None, "nlp", 1.0),
        ("n2", "unmanaged", "raw", None, None, 4.0),
    }


def test_a_failed_read_of_the_jobs_keeps_the_nodes_and_the_jobs_known_last() -> None:
    ray = FakeRay(TWO_NODES)
    ray.outside_job("raw", {"n1": {"NPU": 4.0}})
    cache = InventoryCache(ray, 0.0)
    assert [j.id for j in cache.get().jobs] == ["raw"]
    ray.fail("all_jobs", RayUnavailable("state API busy"))
    again = cache.get()
    assert len(again.nodes) == 2 and [j.id for j in again.jobs] == ["raw"]
    assert again.addresses["n1"]["address"] == "10.0.0.1"
