"""Nodes per team: a mapped team's runs are planned on its group's nodes only and pinned there;
other teams' runs never on them; each group is decided on its own."""

from __future__ import annotations

from fastapi.testclient import TestClient

from service.cluster.inventory_cache import InventoryCache
from service.cluster.registry import Clusters
from service.loops.submitter import Submitter
from service.scheduling.admission import HeldRun, Quotas
from service.scheduling.inventory import Inventory, Node
from service.scheduling.node_groups import NodeGroups, decide_grouped
from service.scheduling.outside import ClusterJob
from service.scheduling.shape import Group, ResourceShape
from service.store.db import Database
from service.store.status import RunStatus
from tests.factories import add_run, read_run
from tests.fake_ray import FakeRay
from tests.test_admission import q

VISION = NodeGroups({"vision": "group-a"})


def cluster(*free: int, groups: tuple[str | None, ...] = ("group-a", "group-a")) -> Inventory:
    """8-NPU nodes n0, n1, ... with ``free`` NPUs; the first ones in ``groups``."""
    return Inventory(
        tuple(
            Node(
                f"n{i}",
                {"NPU": 8, "CPU": 32},
                {"NPU": f, "CPU": 32},
                frozenset({groups[i]} if i < len(groups) and groups[i] else ()),
            )
            for i, f in enumerate(free)
        )
    )


def nodes_of(decision_placement: object) -> set[str]:
    return {s.node for s in decision_placement.slots}  # type: ignore[attr-defined]


def test_a_mapped_team_s_runs_go_to_its_nodes_and_other_teams_to_the_rest() -> None:
    inv = cluster(8, 8, 8, 8)
    d = decide_grouped(
        VISION, [q("v1", 8, team="vision"), q("o1", 8, team="nlp")], [], inv, Quotas()
    )
    assert d.admit == ["v1", "o1"]
    assert nodes_of(d.placements["v1"]) <= {"n0", "n1"}
    assert nodes_of(d.placements["o1"]) <= {"n2", "n3"}


def test_other_teams_wait_rather_than_use_a_group_s_free_nodes() -> None:
    inv = cluster(8, 8, 0, 0)  # the shared nodes are busy, group-a's are free
    d = decide_grouped(
        VISION, [q("o1", 8, team="nlp"), q("v1", 8, 8, team="vision")], [], inv, Quotas()
    )
    assert d.admit == ["v1"] and d.reasons["o1"].startswith("capacity:")
    # And a mapped team waits for its own nodes although the shared ones are free.
    inv = cluster(0, 0, 8, 8)
    assert decide_grouped(VISION, [q("v1", 8, team="vision")], [], inv, Quotas()).admit == []


def test_a_group_s_account_counts_only_its_runs_and_the_jobs_outside_on_its_nodes() -> None:
    inv = cluster(8, 8, 8, 8)  # Ray still shows every node free
    held = [HeldRun("v0", "vision", ResourceShape("NPU", (Group("g", 8, 1.0),), 0.5), False)]
    job = ClusterJob("raw", "SUBMISSION", "RUNNING", "x", 1, {"n2": {"NPU": 8.0}})
    queue = [
        q("v1", 8, team="vision"),
        q("v2", 8, team="vision"),
        q("o1", 8, team="nlp"),
        q("o2", 8, team="nlp"),
    ]
    d = decide_grouped(VISION, queue, held, inv, Quotas(), outside=[job])
    assert sorted(d.admit) == ["o1", "v1"]
    assert "jobs outside rlrun hold 8" in d.reasons["o2"]
    assert "jobs outside" not in d.reasons["v2"]


def test_every_other_team_may_be_mapped_and_a_group_without_nodes_says_so() -> None:
    groups = NodeGroups({"vision": "group-a", "*": "shared"})
    inv = cluster(8, 8, 8, 8, groups=("group-a", "group-a", "shared", "shared"))
    assert groups.node_ids(inv, groups.group_of("nlp")) == {"n2", "n3"}
    assert groups.pin("nlp") == {"shared": 0.001} and groups.pin("vision") == {"group-a": 0.001}
    d = decide_grouped(
        NodeGroups({"vision": "group-b"}), [q("v1", 8, team="vision")], [], inv, Quotas()
    )
    assert d.reasons["v1"] == "capacity: node group group-b has no node in the cluster"


def test_without_a_map_nothing_is_pinned_and_every_node_is_anyone_s() -> None:
    inv = cluster(8, 8)
    assert NodeGroups().pin("vision") == {} and NodeGroups().view(inv, "vision") == inv
    d = decide_grouped(NodeGroups(), [q("o1", 8, 8, team="nlp")], [], inv, Quotas())
    assert d.admit == ["o1"]


def test_the_submitter_pins_a_mapped_team_s_job_to_its_group(db: Database) -> None:
    ray = FakeRay(
        {
            "a1": {"NPU": 8.0, "CPU": 8.0, "group-a": 1000.0},
            "s1": {"NPU": 8.0, "CPU": 8.0},
        }
    )
    add_run(db, "v1", RunStatus.QUEUED, team="vision", npus=8)
    add_run(db, "o1", RunStatus.QUEUED, team="nlp", npus=8)
    add_run(db, "o2", RunStatus.QUEUED, team="nlp", npus=8)
    loop = Submitter(db, ray, InventoryCache(ray, 0.0), Quotas(), "me", 30.0, 10, groups=VISION)
    loop.tick()
    sent = {s["submission_id"]: s["entrypoint_resources"] for s in ray.submitted}
    assert sent == {"v1": {"group-a": 0.001}, "o1": None}
    run, _ = read_run(db, "o2")  # group-a's node is free, but not for nlp
    assert run.status == RunStatus.QUEUED and (run.queue_reason or "").startswith("capacity:")


def test_cluster_and_the_dry_run_show_the_map_and_plan_on_the_team_s_nodes(db_url: str) -> None:
    from dataclasses import replace

    from service.app import create_app
    from tests.conftest import make_settings

    settings = make_settings(
        db_url, "http://127.0.0.1:9", run_loops=False, team_nodes={"vision": "group-a"}
    )
    ray = FakeRay({"a1": {"NPU": 8.0, "CPU": 8.0, "group-a": 1000.0}, "s1": {"NPU": 4.0}})
    with TestClient(create_app(settings)) as client:
        services = client.app.state.services  # type: ignore[attr-defined]
        client.app.state.services = replace(services, clusters=Clusters.single(ray))  # type: ignore[attr-defined]
        view = client.get("/cluster").json()
        assert view["team_nodes"] == {"vision": "group-a"}
        assert {n["id"]: n["group"] for n in view["nodes"]} == {"a1": "group-a", "s1": None}
        spec = {"recipe": "test-script", "npus": 8}
        plan = client.post("/runs?dry_run=true", json={**spec, "team": "vision"}).json()["plan"]
        assert plan["feasible_now"] and plan["node_group"] == "group-a"
        assert {s["node"] for s in plan["placement"]} == {"a1"}
        assert plan["totals"]["cluster"]["NPU"] == 8
        # Another team has only the 4-NPU shared node: 8 can never fit, refused at the door.
        resp = client.post("/runs", json={**spec, "team": "nlp"})
        assert resp.status_code == 422, resp.text
