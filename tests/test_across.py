"""Admission across clusters: each run where it starts soonest, a waiting run reserving on one
cluster only, quotas global and per cluster, clusters down and back, the dry-run plan's
per-cluster reasons; and with one cluster, exactly the decision of ``decide_grouped``."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from service.scheduling import backlog
from service.scheduling.across import ClusterDecision, ClusterState, decide_across
from service.scheduling.admission import HeldRun, QueuedRun, Quotas, held_by_team
from service.scheduling.backlog import plan_across
from service.scheduling.inventory import Inventory, Node
from service.scheduling.node_groups import NodeGroups, decide_grouped
from service.scheduling.outside import ClusterJob
from service.scheduling.shape import ResourceShape
from service.store.db import Database, upgrade
from service.store.models import utcnow
from service.store.status import RunStatus
from tests.factories import add_run
from tests.test_admission import h, nodes, q
from tests.test_admission_scale import rounds

# ---- one cluster decides as decide_grouped -------------------------------------------------

GROUPS = ["ga", "gb"]


@st.composite
def one_cluster(
    draw: st.DrawFn,
) -> tuple[
    list[QueuedRun], list[HeldRun], Inventory, Quotas, int | None, NodeGroups, list[ClusterJob]
]:
    queued, held, inventory, quotas, limit = draw(rounds())
    teams = sorted({r.team for r in queued} | {r.team for r in held})
    mapping: dict[str, str] = {}
    if teams and draw(st.booleans()):
        for team in [*teams, "*"]:
            if draw(st.booleans()):
                mapping[team] = draw(st.sampled_from(GROUPS))
    groups = NodeGroups(mapping)
    if groups:
        # Some nodes in a group (a node in no mapped group is shared).
        tagged = [
            Node(n.id, n.total, n.available, frozenset(draw(st.sampled_from([[], ["ga"], ["gb"]]))))
            for n in inventory.nodes
        ]
        inventory = Inventory(tuple(tagged))
        # A limit with node groups caps in queue order here, group by group there.
        limit = None
        # A shape that asks for nothing "fits" a group without nodes; decide_grouped then says
        # both that it is admitted and that the group has no node.
        queued = [r for r in queued if _asks(r.shape)]
    outside = []
    for i, node in enumerate(inventory.nodes):
        if draw(st.booleans()) and draw(st.booleans()):
            held_there = {node.id: {"NPU": draw(st.sampled_from([1.0, 4.0, 8.0])), "CPU": 1.0}}
            outside.append(ClusterJob(f"x{i}", "SUBMISSION", "RUNNING", "x", 1, held_there))
    return queued, held, inventory, quotas, limit, groups, outside


def _asks(shape: ResourceShape) -> bool:
    return bool(shape.accelerators or shape.driver_cpus or any(g.cpus for g in shape.groups))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(one_cluster())
def test_one_cluster_decides_exactly_as_decide_grouped(
    case: tuple[
        list[QueuedRun], list[HeldRun], Inventory, Quotas, int | None, NodeGroups, list[ClusterJob]
    ],
) -> None:
    queued, held, inventory, quotas, limit, groups, outside = case
    plain = decide_grouped(groups, queued, held, inventory, quotas, limit, outside)
    state = ClusterState("default", inventory, held, outside, groups)
    every = {r.id: ["default"] for r in queued}
    across = decide_across([state], queued, every, quotas, limit)
    assert across.reasons == plain.reasons
    assert {r: across.by_cluster[r] for r in across.reasons} == {
        r: {"default": reason} for r, reason in plain.reasons.items()
    }
    assert across.placements == plain.placements
    if groups:
        # Each group is decided in its own fair order (a team without a quota measured against
        # its group's accelerators); decide_grouped lists the order of the whole cluster.
        rank = {run_id: i for i, run_id in enumerate(plain.order)}
        admit = sorted(across.admit, key=lambda a: rank[a[0]])
    else:
        assert across.order == plain.order
        admit = across.admit
    assert admit == [(run_id, "default") for run_id in plain.admit]


# ---- several clusters ------------------------------------------------------------------------


def a1() -> ClusterState:
    """One node x 8 NPUs."""
    return ClusterState("a1", nodes(8), [])


def a2(*free: int, held: Sequence[HeldRun] = ()) -> ClusterState:
    """Two nodes x 8 NPUs."""
    return ClusterState("a2", nodes(*(free or (8, 8))), list(held))


def everywhere(queued: Sequence[QueuedRun], *names: str) -> dict[str, list[str]]:
    return {r.id: list(names) for r in queued}


def admitted(d: ClusterDecision) -> dict[str, str]:
    return dict(d.admit)


def test_a_run_needing_8_plus_8_lands_on_the_two_node_cluster() -> None:
    queue = [q("big", 8, 8)]
    d = decide_across([a1(), a2()], queue, everywhere(queue, "a1", "a2"), Quotas())
    assert admitted(d) == {"big": "a2"}
    assert d.by_cluster["big"] == {
        "a1": "capacity: can never fit this cluster's nodes",
        "a2": "fits now",
    }
    assert {s.node for s in d.placements["big"].slots if s.role == "g"} == {"n0", "n1"}


def test_a_small_run_goes_where_it_fits_now_and_fills_the_tighter_cluster() -> None:
    queue = [q("small", 1, 1)]
    # Both free: the one-node cluster is the tighter fit, the two-node one stays whole.
    d = decide_across([a2(), a1()], queue, everywhere(queue, "a2", "a1"), Quotas())
    assert admitted(d) == {"small": "a1"}
    # The one-node cluster busy: it goes where it fits now.
    busy = ClusterState("a1", nodes(0), [h("x", 8)])
    d = decide_across([busy, a2()], queue, everywhere(queue, "a1", "a2"), Quotas())
    assert admitted(d) == {"small": "a2"}
    assert d.by_cluster["small"]["a1"].startswith("capacity: needs 2 x 1 NPU")


def test_a_run_only_goes_to_the_clusters_its_team_may_use() -> None:
    queue = [q("v1", 8, team="vision"), q("n1", 8, team="nlp")]
    candidates = {"v1": ["a1"], "n1": ["a2"]}
    busy = ClusterState("a1", nodes(0), [h("x", 8)])
    d = decide_across([busy, a2()], queue, candidates, Quotas())
    assert admitted(d) == {"n1": "a2"}
    assert d.reasons["v1"].startswith("waits for a1: capacity: needs 8 NPU on one node")
    assert set(d.by_cluster["v1"]) == {"a1"}
    # With no cluster at all, it says so.
    d = decide_across([busy, a2()], queue, {"n1": ["gpu"]}, Quotas())
    assert d.reasons == {"v1": "no cluster this run may use", "n1": "no cluster this run may use"}


def test_a_waiting_run_reserves_on_one_cluster_and_a_small_one_backfills_on_the_other() -> None:
    # a1: its node has 4 free; a2: one node busy, one with 4 free. The head needs 8 on one node.
    c1 = ClusterState("a1", nodes(4), [h("x1", 4)])
    c2 = ClusterState("a2", nodes(0, 4), [h("x2", 8), h("x3", 4)])
    queue = [q("head", 8), q("small", 4)]
    d = decide_across([c1, c2], queue, everywhere(queue, "a1", "a2"), Quotas())
    # It lacks 4 on a1's node and 4 on a2's freest node: a tie, the first candidate wins. It
    # reserves a1's node only, so the small run backfills on a2.
    assert d.reasons["head"].startswith("waits for a1: capacity: needs 8 NPU on one node")
    assert admitted(d) == {"small": "a2"}
    assert d.by_cluster["small"]["a1"] == (
        "behind run head, which waits for capacity (backfill would delay it)"
    )
    # Had it reserved on both clusters, the small run could start nowhere: on one, it backfills.
    only = decide_across([c1], queue, everywhere(queue, "a1"), Quotas())
    assert only.admit == []


def test_a_waiting_run_picks_the_cluster_with_fewer_runs_ahead_then_less_missing() -> None:
    c1 = ClusterState("a1", nodes(2), [h("x1", 6)])  # lacks 6 there
    c2 = ClusterState("a2", nodes(0, 6), [h("x2", 8), h("x3", 2)])  # lacks 2 on n1
    queue = [q("first", 8), q("second", 8), q("third", 8)]
    d = decide_across([c1, c2], queue, everywhere(queue, "a1", "a2"), Quotas())
    assert d.admit == []
    assert d.reasons["first"].startswith("waits for a2:")
    # The second finds a2's head ahead of it; a1 has no one waiting: it waits (reserves) there.
    assert d.reasons["second"].startswith("waits for a1:")
    assert "run ahead of it wait there" not in d.reasons["second"]
    # The third finds one run ahead on each: the one it lacks less on.
    assert d.reasons["third"].startswith("waits for a2:")
    assert "; 1 run ahead of it wait there" in d.reasons["third"]


def test_per_cluster_quotas_and_global_quotas_both_hold() -> None:
    # Per cluster: vision may hold 8 on a1; its second run goes to a2.
    c1 = ClusterState("a1", nodes(8, 8), [], quotas=Quotas({"vision": 8}))
    c2 = ClusterState("a2", nodes(8, 8), [])
    queue = [q("v1", 8, team="vision"), q("v2", 8, team="vision"), q("v3", 8, team="vision")]
    d = decide_across([c1, c2], queue, everywhere(queue, "a1", "a2"), Quotas())
    assert admitted(d) == {"v1": "a1", "v2": "a2", "v3": "a2"}
    # Globally: 16 over both clusters, those admitted earlier in the round included.
    d = decide_across([c1, c2], queue, everywhere(queue, "a1", "a2"), Quotas({"vision": 16}))
    assert admitted(d) == {"v1": "a1", "v2": "a2"}
    assert d.reasons["v3"] == (
        "quota: team vision holds 16 of its 16 accelerators; this run needs 8"
    )
    # Runs held on any cluster count against the global quota.
    c2 = ClusterState("a2", nodes(8, 8), [h("v0", 8, team="vision")])
    d = decide_across([c1, c2], queue, everywhere(queue, "a1", "a2"), Quotas({"vision": 16}))
    assert admitted(d) == {"v1": "a1"}
    # Only a per-cluster quota in the way: the run waits for it, naming the cluster.
    c1 = ClusterState("a1", nodes(8, 8), [h("v5", 8, team="vision")], quotas=Quotas({"vision": 8}))
    c2 = ClusterState("a2", nodes(8), [])
    d = decide_across([c1, c2], [q("v4", 8, 8, team="vision")], {"v4": ["a1", "a2"]}, Quotas())
    assert d.reasons["v4"] == (
        "waits for a1: quota: team vision holds 8 of its 8 accelerators on a1; this run needs 16"
        "; a2: capacity: can never fit this cluster's nodes"
    )


def test_a_cluster_down_admits_nothing_and_its_runs_move_or_wait_for_it() -> None:
    down = ClusterState("a2", None, [], down="cluster down since 12:01:03")
    queue = [q("big", 8, 8), q("small", 1)]
    d = decide_across([a1(), down], queue, everywhere(queue, "a1", "a2"), Quotas())
    # The small run moves to the cluster that is up; the big one fits only the one that is down.
    assert admitted(d) == {"small": "a1"}
    assert d.reasons["big"] == (
        "waits for a2: cluster down since 12:01:03; "
        "a1: capacity: can never fit this cluster's nodes"
    )
    assert d.by_cluster["small"]["a2"] == "cluster down since 12:01:03"
    # Down with its last known nodes: still nothing admitted there, whatever they show.
    known = ClusterState("a2", nodes(8, 8), [], down="head not answering")
    d = decide_across([known], [q("big", 8, 8)], {"big": ["a2"]}, Quotas())
    assert d.admit == [] and d.reasons["big"] == "cluster down: head not answering"
    # Back: admitted there.
    d = decide_across([a1(), a2()], queue, everywhere(queue, "a1", "a2"), Quotas())
    assert admitted(d) == {"big": "a2", "small": "a1"}


def test_the_limit_caps_admissions_over_all_clusters_in_queue_order() -> None:
    queue = [q("r1", 8), q("r2", 8), q("r3", 8)]
    d = decide_across([a1(), a2()], queue, everywhere(queue, "a1", "a2"), Quotas(), limit=2)
    assert [run_id for run_id, _ in d.admit] == ["r1", "r2"]
    assert d.reasons["r3"] == (
        "waits for a2: next in line; "
        "a1: capacity: needs 8 NPU on one node; admitted runs hold 8 of 8 NPU"
    )


def test_node_groups_apply_per_cluster() -> None:
    vision = NodeGroups({"vision": "group-a"})
    tagged = Inventory(
        (
            Node("n0", {"NPU": 8, "CPU": 32}, {"NPU": 8, "CPU": 32}, frozenset({"group-a"})),
            Node("n1", {"NPU": 8, "CPU": 32}, {"NPU": 8, "CPU": 32}),
        )
    )
    c1 = ClusterState("a1", tagged, [], groups=vision)
    queue = [q("v1", 8, team="vision"), q("o1", 8, 8, team="nlp"), q("o2", 8, team="nlp")]
    d = decide_across([c1, a2()], queue, everywhere(queue, "a1", "a2"), Quotas())
    assert admitted(d) == {"v1": "a1", "o1": "a2", "o2": "a1"}
    assert {s.node for s in d.placements["o2"].slots if s.role == "g"} == {"n1"}


# ---- the dry-run plan ------------------------------------------------------------------------


def test_the_plan_names_the_cluster_chosen_why_and_each_cluster_s_reason() -> None:
    gpu = ClusterState("gpu", None, [], down="cluster down since 12:01:03")
    states = [a1(), a2(), gpu]
    run = q("new", 8, 8)
    plan = plan_across(states, [], {"new": ["a1", "a2"]}, run, Quotas())
    assert plan["cluster"] == "a2" and plan["why"] == "fits now"
    assert plan["feasible_now"] is True and plan["feasible_ever"] is True
    assert {s["node"] for s in plan["placement"] if s["role"] == "g"} == {"n0", "n1"}
    assert plan["totals"]["cluster"]["NPU"] == 16
    assert plan["clusters"] == [
        {
            "name": "a1",
            "candidate": True,
            "down": None,
            "feasible_ever": False,
            "feasible_now": False,
            "reason": "capacity: can never fit this cluster's nodes",
        },
        {
            "name": "a2",
            "candidate": True,
            "down": None,
            "feasible_ever": True,
            "feasible_now": True,
            "reason": "fits now",
        },
        {
            "name": "gpu",
            "candidate": False,
            "down": "cluster down since 12:01:03",
            "feasible_ever": None,
            "feasible_now": False,
            "reason": "not a cluster this run may use",
        },
    ]


def test_the_plan_of_a_run_that_fits_on_two_clusters_says_so_of_both() -> None:
    plan = plan_across([a1(), a2()], [], {"new": ["a1", "a2"]}, q("new", 1), Quotas())
    assert plan["why"] == "fits now on 2 clusters; this one it fills most tightly"
    assert [(c["name"], c["feasible_now"], c["reason"]) for c in plan["clusters"]] == [
        ("a1", True, "fits now"),
        ("a2", True, "fits now"),
    ]


def test_the_plan_of_a_run_that_waits_names_the_cluster_it_waits_for() -> None:
    c1 = ClusterState("a1", nodes(0), [h("x1", 8)])
    c2 = ClusterState("a2", nodes(0, 0), [h("x2", 8), h("x3", 8)])
    queue = [q("first", 8)]
    candidates = {"first": ["a1", "a2"], "new": ["a1", "a2"]}
    plan = plan_across([c1, c2], queue, candidates, q("new", 8), Quotas())
    # The first queued run waits (and reserves) on a1; the new one on a2, where none is ahead.
    assert plan["cluster"] == "a2" and plan["queue_position"] == 1
    assert plan["why"].startswith("fits later on 2 clusters; it would start soonest on this one")
    assert plan["feasible_now"] is False and plan["feasible_ever"] is True
    assert plan["reasons"] == [
        "waits for a2: capacity: needs 8 NPU on one node; admitted runs hold 16 of 16 NPU; "
        "a1: capacity: needs 8 NPU on one node; admitted runs hold 8 of 8 NPU"
    ]
    # A cluster it may use that cannot be read is a warning; none that fits: unknown.
    down = ClusterState("a3", None, [])
    plan = plan_across([a1(), down], [], {"new": ["a1", "a3"]}, q("new", 16), Quotas())
    assert plan["feasible_ever"] is None and plan["cluster"] == "a3"
    assert plan["warnings"] == ["cluster a3 could not be read: its fit was not checked"]
    assert plan["why"] == "the only clusters where it could fit are down"


def test_with_one_cluster_the_plan_answers_as_the_plan_of_one_cluster(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/plan.db"
    upgrade(url)
    db = Database(url)
    add_run(db, "h1", RunStatus.RUNNING, npus=8)
    add_run(db, "q1", RunStatus.QUEUED, npus=8)
    add_run(db, "q2", RunStatus.QUEUED, npus=4, team="u")
    inventory = nodes(0, 8, 4)
    candidate = q("new", 4, team="u")
    quotas = Quotas({"u": 8})
    now = utcnow()
    try:
        with db.read() as session:
            one = backlog.plan(session, inventory, candidate, quotas, now)
            queue = [r.run for r in backlog.queued(session, now)]
            held = backlog.held(session, now, inventory.fetched_at)
    finally:
        db.dispose()
    state = ClusterState("default", inventory, held)
    every = {r.id: ["default"] for r in [*queue, candidate]}
    plan = plan_across([state], queue, every, candidate, quotas)
    assert one["reasons"] and one["placement"]  # a run that waits, with where it would go
    assert {k: plan[k] for k in one} == one
    assert plan["cluster"] == "default"


# ---- what holds of every round over several clusters ---------------------------------------


@st.composite
def several(
    draw: st.DrawFn,
) -> tuple[list[ClusterState], list[QueuedRun], dict[str, list[str]], Quotas, int | None]:
    states = []
    for c in range(draw(st.integers(1, 4))):
        queued, held, inventory, quotas, _ = draw(rounds())
        held = [HeldRun(f"c{c}{r.id}", r.team, r.shape, r.settled) for r in held]
        down = draw(st.sampled_from([None, None, None, "cluster down since 12:01:03"]))
        known = inventory if down is None or draw(st.booleans()) else None
        states.append(ClusterState(f"c{c}", known, held, quotas=quotas, down=down))
    names = [s.name for s in states]
    queued, _, _, quotas, limit = draw(rounds())
    candidates = {r.id: draw(st.lists(st.sampled_from(names), unique=True)) for r in queued}
    return states, queued, candidates, quotas, limit


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(several())
def test_every_round_keeps_to_candidates_capacity_quotas_and_the_limit(
    case: tuple[list[ClusterState], list[QueuedRun], dict[str, list[str]], Quotas, int | None],
) -> None:
    states, queued, candidates, quotas, limit = case
    d = decide_across(states, queued, candidates, quotas, limit)
    runs = {r.id: r for r in queued}
    by_name = {s.name: s for s in states}
    assert limit is None or len(d.admit) <= limit
    assert set(d.reasons) | {run_id for run_id, _ in d.admit} == set(runs)
    assert not set(d.reasons) & {run_id for run_id, _ in d.admit}
    used = held_by_team([h for s in states for h in s.held])
    on: dict[tuple[str, str], int] = {}
    for run_id, name in d.admit:
        run, state = runs[run_id], by_name[name]
        # Only a cluster it may use, that is up, and (gang admission) every group on its nodes.
        assert name in candidates[run_id] and state.down is None and state.inventory
        placement = d.placements[run_id]
        assert sorted(s.accelerators for s in placement.slots if s.role != "driver") == sorted(
            g.accelerators for g in run.shape.groups
        )
        used[run.team] += run.shape.accelerators
        key = (name, run.team)
        on[key] = on.get(key, sum(h.shape.accelerators for h in state.held if h.team == run.team))
        on[key] += run.shape.accelerators
        # Quotas hold, over all clusters and on this one.
        assert quotas.of(run.team) is None or used[run.team] <= quotas.of(run.team)  # type: ignore[operator]
        own = state.quotas.of(run.team)
        assert own is None or on[key] <= own
    for name, state in by_name.items():
        # What is admitted on a node fits what Ray shows free there.
        if state.inventory is None:
            continue
        free = {n.id: dict(n.available) for n in state.inventory.nodes}
        taken: dict[str, float] = {}
        for run_id, where in d.admit:
            if where != name:
                continue
            for slot in d.placements[run_id].slots:
                taken[slot.node] = taken.get(slot.node, 0.0) + slot.accelerators
        unsettled = any(not h.settled for h in state.held)
        if not unsettled:
            for node, amount in taken.items():
                assert amount <= free[node].get("NPU", 0.0) + 1e-9
