"""Admission on a given inventory: gang fit, order, fairness, quotas, backfill, reasons."""

from __future__ import annotations

from service.scheduling.admission import HeldRun, QueuedRun, Quotas, decide
from service.scheduling.inventory import Inventory, Node
from service.scheduling.priority import PRIORITIES
from service.scheduling.shape import Group, ResourceShape

NORMAL, HIGH, LOW = PRIORITIES["normal"], PRIORITIES["high"], PRIORITIES["low"]


def nodes(*free: int, total: int = 8) -> Inventory:
    """Nodes of ``total`` NPUs (32 CPUs) with ``free`` NPUs available as Ray reports them."""
    return Inventory(
        tuple(
            Node(f"n{i}", {"NPU": total, "CPU": 32}, {"NPU": f, "CPU": 32})
            for i, f in enumerate(free)
        )
    )


def groups(*sizes: int) -> ResourceShape:
    return ResourceShape("NPU", tuple(Group("g", s, 1.0) for s in sizes), 0.5)


def q(run_id: str, *sizes: int, team: str = "a", priority: int = NORMAL) -> QueuedRun:
    return QueuedRun(run_id, team, priority, groups(*sizes))


def h(run_id: str, *sizes: int, team: str = "a", settled: bool = True) -> HeldRun:
    return HeldRun(run_id, team, groups(*sizes), settled)


def test_two_runs_that_each_need_the_whole_cluster_are_admitted_one_at_a_time() -> None:
    d = decide([q("r1", 8, 8), q("r2", 8, 8)], [], nodes(8, 8), Quotas())
    assert d.admit == ["r1"]
    assert d.reasons["r2"].startswith("capacity: needs 2 x 8 NPU, each on one node")
    d = decide([q("r2", 8, 8)], [h("r1", 8, 8, settled=False)], nodes(8, 8), Quotas())
    assert d.admit == []


def test_admitted_runs_count_even_while_ray_still_shows_their_resources_free() -> None:
    # Ray's "available" lags: the service's own account keeps the second run out.
    d = decide([q("r2", 8)], [h("r1", 8, 8, settled=False)], nodes(8, 8), Quotas())
    assert d.admit == [] and "r2" in d.reasons
    # Even once settled: whatever Ray reports, admitted runs hold what they hold.
    d = decide([q("r2", 8)], [h("r1", 8, 8, settled=True)], nodes(8, 8), Quotas())
    assert d.admit == []
    assert d.reasons["r2"] == "capacity: needs 8 NPU on one node; admitted runs hold 16 of 16 NPU"


def test_resources_ray_reports_in_use_outside_the_service_are_respected() -> None:
    d = decide([q("r1", 8, 8)], [], nodes(8, 0), Quotas())
    assert d.admit == []
    assert d.reasons["r1"] == (
        "capacity: needs 2 x 8 NPU, each on one node; largest free: 8 NPU on one node"
    )


def test_high_priority_goes_first_then_fifo_within_a_class() -> None:
    queued = [q("n1", 8), q("l1", 8, priority=LOW), q("h1", 8, 8, priority=HIGH), q("n2", 8)]
    d = decide(queued, [h("x", 8)], nodes(0, 8), Quotas())
    assert d.order == ["h1", "n1", "n2", "l1"]
    assert d.admit == []
    assert d.reasons["n1"] == "behind higher-priority run h1"


def test_a_team_far_below_its_share_goes_before_older_runs_of_a_busy_team() -> None:
    queued = [q("a1", 4, team="a"), q("a2", 4, team="a"), q("b1", 4, team="b")]
    d = decide(queued, [h("a0", 8, team="a")], nodes(0, 8), Quotas())
    assert d.order == ["b1", "a1", "a2"]
    assert d.admit == ["b1", "a1"]
    # With no one holding anything, teams take turns by accelerators already ahead of them.
    d = decide(queued, [], nodes(8, 8), Quotas())
    assert d.order == ["a1", "b1", "a2"]


def test_a_team_over_its_quota_waits_while_another_teams_run_starts() -> None:
    queued = [q("v2", 8, team="vision"), q("t1", 8, team="text")]
    d = decide(queued, [h("v1", 8, team="vision")], nodes(0, 8, 8), Quotas({"vision": 8}))
    assert d.admit == ["t1"]
    assert d.reasons["v2"] == "quota: team vision holds 8 of its 8 accelerators; this run needs 8"
    d = decide(queued, [h("v1", 8, team="vision")], nodes(0, 8, 8), Quotas(default=8))
    assert d.admit == ["t1"]


def test_backfill_uses_only_what_the_waiting_head_run_will_not_need() -> None:
    # n0 is free, n1 and n2 each have 2 NPUs free: the head (2 x 8) waits and reserves n0 + n1.
    held = [h("x1", 6), h("x2", 6)]
    queued = [q("head", 8, 8), q("small", 2), q("big", 8), q("mid", 4)]
    d = decide(queued, held, nodes(8, 2, 2), Quotas())
    assert d.admit == ["small"]
    assert {s.node for s in d.placements["small"].slots if s.role == "g"} == {"n2"}
    assert d.reasons["head"].startswith("capacity: needs 2 x 8 NPU")
    behind = "behind run head, which waits for capacity (backfill would delay it)"
    assert d.reasons["big"] == d.reasons["mid"] == behind
    # Once the small run took n2, nothing is left outside the reservation.
    d = decide([q("head", 8, 8), q("tiny", 1)], [*held, h("small", 2)], nodes(8, 2, 0), Quotas())
    assert d.admit == [] and d.reasons["tiny"] == behind


def test_a_run_that_can_never_fit_does_not_block_the_queue() -> None:
    d = decide([q("huge", 16), q("ok", 8)], [], nodes(8, 8), Quotas())
    assert d.admit == ["ok"]
    assert d.reasons["huge"] == "capacity: can never fit this cluster's nodes"


def test_the_batch_limit_leaves_the_rest_next_in_line() -> None:
    d = decide([q("r1", 1), q("r2", 1), q("r3", 1)], [], nodes(8), Quotas(), limit=2)
    assert d.admit == ["r1", "r2"] and d.reasons["r3"] == "next in line"


def test_a_thousand_queued_runs_on_a_hundred_nodes_fill_the_cluster_exactly() -> None:
    queued = [q(f"r{i:04d}", 8, team=f"t{i % 7}") for i in range(1000)]
    d = decide(queued, [], nodes(*[8] * 100), Quotas())
    assert len(d.admit) == 100 and len(d.reasons) == 900
