"""Preemption for priority, decided on a given inventory: the victims that lose the least, the
fewest of them, and the runs spared (recently admitted, preempted often, the operator's policy on
priorities, teams and runs that save nothing, quota);
and exactly the choice of the straightforward one (``preemption_reference``)."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from service.scheduling.admission import QueuedRun, Quotas
from service.scheduling.inventory import Inventory, Node
from service.scheduling.preemption import (
    NO_CHECKPOINTS,
    Policy,
    Running,
    Site,
    choose,
    choose_across,
)
from service.scheduling.shape import Group, ResourceShape
from tests import preemption_reference

NOW = 1_000_000.0
LONG_AGO = NOW - 3600


def shape(npus: int) -> ResourceShape:
    return ResourceShape(groups=(Group("job", npus, 1.0),), driver_cpus=0.1)


def full(*sizes: int) -> Inventory:
    """Nodes of these sizes, every accelerator in use."""
    return Inventory(
        tuple(
            Node(f"n{i}", {"NPU": float(n), "CPU": 64.0}, {"NPU": 0.0, "CPU": 32.0})
            for i, n in enumerate(sizes)
        )
    )


def low(run_id: str, npus: int = 8, **kw: object) -> Running:
    fields: dict[str, object] = {"admitted_at": LONG_AGO, "started_at": LONG_AGO}
    fields |= kw
    return Running(
        run_id, str(fields.pop("team", "t")), int(fields.pop("priority", 0)), shape(npus), **fields
    )  # type: ignore[arg-type]


HIGH = QueuedRun("urgent", "h", 2, shape(8))


def victims(choice: object) -> list[list[str]]:
    return [[v.id for v in p.victims] for p in choice.preemptions]  # type: ignore[attr-defined]


def test_the_victim_is_the_run_whose_recorded_save_is_newest_whatever_its_job_logs() -> None:
    # Ranked on the service's clock since the save it recorded: the steps a job prints (another
    # team's job can print them into its log) are told, never ranked on.
    running = [
        low("a", unsaved_s=300.0, steps_lost=0),
        low("b", unsaved_s=10.0, steps_lost=900_000),
        low("c", unsaved_s=120.0, steps_lost=0),
    ]
    choice = choose([HIGH], running, full(8, 8, 8), Quotas(), Policy(), NOW)
    assert victims(choice) == [["b"]]
    assert choice.preemptions[0].reason == "preempted for run urgent (high)"
    assert choice.preemptions[0].victims[0].steps_lost == 900_000


def test_ties_go_to_the_lowest_priority_then_the_latest_started() -> None:
    running = [
        low("normal", priority=1, unsaved_s=1.0),
        low("early", unsaved_s=1.0, started_at=LONG_AGO),
        low("late", unsaved_s=1.0, started_at=LONG_AGO + 60),
    ]
    assert victims(choose([HIGH], running, full(8, 8, 8), Quotas(), Policy(), NOW)) == [["late"]]


def test_the_fewest_victims_that_make_room() -> None:
    # Two 4-NPU runs on one node lose nothing; an 8-NPU run alone on the other loses 1 step.
    running = [low("x", 4, unsaved_s=0.0), low("y", 4, unsaved_s=0.0), low("z", 8, unsaved_s=1.0)]
    choice = choose([HIGH], running, full(8, 8), Quotas(), Policy(), NOW)
    assert sorted(victims(choice)[0]) == ["x", "y"]
    need_one = [low("x", 4, unsaved_s=0.0), low("z", 8, unsaved_s=0.0)]
    assert victims(choose([HIGH], need_one, full(4, 8), Quotas(), Policy(), NOW)) == [["z"]]


def test_churn_guards_spare_a_run_admitted_lately_or_preempted_often() -> None:
    running = [
        low("fresh", admitted_at=NOW - 60, unsaved_s=0.0),
        low("often", times=3, last_preempted_at=NOW - 600, unsaved_s=0.0),
    ]
    choice = choose([HIGH], running, full(8, 8), Quotas(), Policy(), NOW)
    assert choice.preemptions == []
    assert choice.spared["fresh"] == "admitted 60 s ago (not preempted before 600 s)"
    assert choice.spared["often"] == "preempted 3 times: left alone for 3000 s more"
    rested = [low("often", times=3, last_preempted_at=NOW - 4000, unsaved_s=0.0)]
    assert victims(choose([HIGH], rested, full(8), Quotas(), Policy(), NOW)) == [["often"]]


def test_whether_a_run_that_saves_nothing_is_preempted_is_the_operators_choice() -> None:
    # By default saving nothing exempts nothing: the run is chosen last, losing all it did.
    running = [low("nock", saves=False), low("saves", unsaved_s=3000.0)]
    assert victims(choose([HIGH], running, full(8, 8), Quotas(), Policy(), NOW)) == [["saves"]]
    assert victims(choose([HIGH], running[:1], full(8), Quotas(), Policy(), NOW)) == [["nock"]]
    assert Policy().at_submit(0, checkpoints=False).startswith("saves no checkpoints: may be")
    strict = Policy(without_checkpoints=False)
    choice = choose([HIGH], running[:1], full(8), Quotas(), strict, NOW)
    assert choice.preemptions == [] and choice.spared["nock"] == NO_CHECKPOINTS
    assert strict.at_submit(0, checkpoints=False) == NO_CHECKPOINTS
    assert Policy().at_submit(2, checkpoints=False) == "priority high: never preempted"


def test_a_team_the_operator_spares_is_never_preempted() -> None:
    policy = Policy(spared_teams=frozenset({"ops"}))
    choice = choose([HIGH], [low("kept", team="ops")], full(8), Quotas(), policy, NOW)
    assert choice.preemptions == [] and choice.spared["kept"] == "team ops's runs are not preempted"
    assert policy.at_submit(0, checkpoints=True, team="ops") == "team ops: never preempted"
    assert victims(choose([HIGH], [low("other", team="t")], full(8), Quotas(), policy, NOW))


def test_only_lower_priorities_and_preemptible_ones_are_victims() -> None:
    same = [low("peer", priority=2, unsaved_s=0.0)]
    assert choose([HIGH], same, full(8), Quotas(), Policy(), NOW).preemptions == []
    normal = QueuedRun("n", "h", 1, shape(8))
    assert victims(choose([normal], [low("l", unsaved_s=0.0)], full(8), Quotas(), Policy(), NOW))
    only_low = Policy(preemptible=frozenset({0}))
    normal_run = [low("nm", priority=1, unsaved_s=0.0)]
    choice = choose([HIGH], normal_run, full(8), Quotas(), only_low, NOW)
    assert choice.preemptions == [] and choice.spared["nm"] == "priority normal is not preemptible"


def test_no_team_preempts_its_way_over_its_quota() -> None:
    running = [low("theirs", team="o", unsaved_s=0.0), low("mine", team="h", unsaved_s=5.0)]
    assert choose([HIGH], running, full(8, 8), Quotas({"h": 8}), Policy(), NOW).preemptions == []
    # Its own run's accelerators come back to its quota: preempting it keeps the team within.
    mine_only = [low("mine", team="h", unsaved_s=5.0)]
    assert victims(choose([HIGH], mine_only, full(8), Quotas({"h": 8}), Policy(), NOW)) == [
        ["mine"]
    ]


def test_runs_already_stopping_make_the_room_and_nothing_more_is_preempted() -> None:
    running = [low("going", unsaved_s=0.0, stopping=True), low("b", unsaved_s=0.0)]
    assert choose([HIGH], running, full(8, 8), Quotas(), Policy(), NOW).preemptions == []
    # A second high run gets room of its own.
    second = QueuedRun("urgent2", "h", 2, shape(8))
    choice = choose([HIGH, second], running, full(8, 8), Quotas(), Policy(), NOW)
    assert [(p.run.id, [v.id for v in p.victims]) for p in choice.preemptions] == [
        ("urgent2", ["b"])
    ]


def test_across_clusters_a_run_preempts_where_it_waits_first_else_where_it_may_go() -> None:
    # It waits for "a" (its first), where nothing is preemptible; "b" has a low run to stop.
    sites = {
        "a": Site(full(8), [low("peer", priority=2, unsaved_s=0.0)]),
        "b": Site(full(8), [low("cheap", unsaved_s=0.0)]),
    }
    choice = choose_across([HIGH], sites, {"urgent": ["a", "b"]}, Quotas(), Policy(), NOW)
    assert victims(choice) == [["cheap"]] and choice.preemptions[0].cluster == "b"
    # Where both could make room, the one it waits for first is used.
    sites["a"] = Site(full(8), [low("costly", unsaved_s=4.0)])
    choice = choose_across([HIGH], sites, {"urgent": ["a", "b"]}, Quotas(), Policy(), NOW)
    assert victims(choice) == [["costly"]] and choice.preemptions[0].cluster == "a"
    # A cluster it may not use is never touched.
    assert (
        choose_across([HIGH], sites, {"urgent": ["c"]}, Quotas(), Policy(), NOW).preemptions == []
    )


def test_across_clusters_quotas_hold_over_all_clusters_and_on_each() -> None:
    # Team h holds 8 on "a"; its quota of 8 over all clusters leaves no room to preempt on "b".
    sites = {
        "a": Site(full(8), [low("held", team="h", priority=2, unsaved_s=0.0)]),
        "b": Site(full(8), [low("theirs", team="o", unsaved_s=0.0)]),
    }
    where = {"urgent": ["b"]}
    assert choose_across([HIGH], sites, where, Quotas({"h": 8}), Policy(), NOW).preemptions == []
    assert victims(choose_across([HIGH], sites, where, Quotas({"h": 16}), Policy(), NOW))
    # A quota of the cluster's own holds there.
    sites["b"] = Site(full(8), [low("theirs", team="o", unsaved_s=0.0)], quotas=Quotas({"h": 4}))
    assert choose_across([HIGH], sites, where, Quotas(), Policy(), NOW).preemptions == []
    # Two waiting runs: the second gets room of its own, on the other cluster.
    sites = {"a": Site(full(8), [low("x", unsaved_s=0.0)]), "b": Site(full(8), [low("y")])}
    second = QueuedRun("urgent2", "h", 2, shape(8))
    both = {"urgent": ["a", "b"], "urgent2": ["a", "b"]}
    choice = choose_across([HIGH, second], sites, both, Quotas(), Policy(), NOW)
    assert [(p.run.id, p.cluster, [v.id for v in p.victims]) for p in choice.preemptions] == [
        ("urgent", "a", ["x"]),
        ("urgent2", "b", ["y"]),
    ]


# ---- the same choice as the straightforward one (preemption_reference) ----------------------

PALETTE = [
    shape(8),
    shape(4),
    shape(16),
    ResourceShape(groups=(Group("a", 4, 2.0),) * 2),
    ResourceShape(driver_cpus=40.0),
]


@st.composite
def preemption_rounds(
    draw: st.DrawFn,
) -> tuple[list[QueuedRun], list[Running], Inventory, Quotas, Policy, int]:
    nodes = []
    for i in range(draw(st.integers(1, 8))):
        npus = draw(st.sampled_from([8.0, 16.0]))
        free = draw(st.sampled_from([0.0, 0.0, 0.0, 4.0, npus]))
        nodes.append(Node(f"n{i}", {"NPU": npus, "CPU": 64.0}, {"NPU": free, "CPU": 32.0}))
    teams = ["t0", "t1", "t2"]

    def head(name: str, priorities: list[int]) -> tuple[str, str, int, ResourceShape]:
        """A run's id, team, priority and shape."""
        return (
            name,
            draw(st.sampled_from(teams)),
            draw(st.sampled_from(priorities)),
            draw(st.sampled_from(PALETTE)),
        )

    running = [
        Running(
            *head(f"r{i:02d}", [0, 0, 1, 2]),
            admitted_at=NOW - draw(st.sampled_from([60.0, 3600.0, 3600.0])),
            started_at=draw(st.sampled_from([None, LONG_AGO, LONG_AGO + 60])),
            saves=draw(st.sampled_from([False, True, True, True])),
            unsaved_s=draw(st.sampled_from([0.0, 0.0, 60.0, 180.0])),
            steps_lost=draw(st.sampled_from([0, 5])),
            times=draw(st.sampled_from([0, 0, 1, 3, 4])),
            last_preempted_at=draw(st.sampled_from([None, NOW - 600, NOW - 4000])),
            stopping=draw(st.sampled_from([False] * 5 + [True])),
            settled=draw(st.sampled_from([True, True, False])),
        )
        for i in range(draw(st.integers(1, 14)))
    ]
    waiting = [QueuedRun(*head(f"q{i:02d}", [0, 1, 2, 2])) for i in range(draw(st.integers(0, 10)))]
    quotas = Quotas({t: draw(st.sampled_from([8, 16, 64])) for t in teams if draw(st.booleans())})
    policy = Policy(
        without_checkpoints=draw(st.booleans()),
        preemptible=frozenset(draw(st.sampled_from([[0, 1], [0, 1], [0], [1], []]))),
        spared_teams=frozenset(draw(st.sampled_from([[], [], ["t1"]]))),
    )
    return waiting, running, Inventory(tuple(nodes)), quotas, policy, draw(st.integers(1, 8))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(preemption_rounds())
def test_the_choice_is_the_straightforward_one(
    case: tuple[list[QueuedRun], list[Running], Inventory, Quotas, Policy, int],
) -> None:
    waiting, running, inventory, quotas, policy, tries = case
    fast = choose(waiting, running, inventory, quotas, policy, NOW, tries=tries)
    plain = preemption_reference.choose(
        waiting, running, inventory, quotas, policy, NOW, tries=tries
    )
    assert [(p.run, p.victims) for p in fast.preemptions] == [
        (p.run, p.victims) for p in plain.preemptions
    ]
    assert list(fast.spared.items()) == list(plain.spared.items())
    assert fast.waits_on == plain.waits_on
