"""Admission at scale decides exactly as the straightforward round (admission_reference)."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from service.scheduling.admission import HeldRun, QueuedRun, Quotas, decide
from service.scheduling.inventory import Inventory, Node
from service.scheduling.placement import Pool, pack
from service.scheduling.shape import Group, ResourceShape
from tests import admission_reference

SIZES = st.sampled_from([0, 1, 2, 4, 8, 16])
CPUS = st.sampled_from([0.0, 1.0, 2.0, 4.5, 8.0, 24.0])


@st.composite
def shapes(draw: st.DrawFn) -> ResourceShape:
    groups = draw(st.lists(st.tuples(SIZES, CPUS), max_size=4))
    driver = draw(st.sampled_from([0.0, 0.5, 1.0, 23.0]))
    return ResourceShape(
        "NPU", tuple(Group(f"g{i}", a, c) for i, (a, c) in enumerate(groups)), driver
    )


@st.composite
def rounds(
    draw: st.DrawFn,
) -> tuple[list[QueuedRun], list[HeldRun], Inventory, Quotas, int | None]:
    nodes = []
    for i in range(draw(st.integers(0, 12))):
        npus = draw(st.sampled_from([0.0, 8.0, 8.0, 16.0]))
        cpus = draw(st.sampled_from([16.0, 64.0, 192.0]))
        busy = draw(st.sampled_from([0.0, 0.5, 1.0, 1.0]))
        nodes.append(
            Node(
                f"n{i:02d}",
                {"NPU": npus, "CPU": cpus},
                {"NPU": npus * (1 - busy), "CPU": cpus * (1 - busy / 2)},
            )
        )
    # A few distinct shapes, each used by many runs (as distinct but equal objects, as when read
    # from the database, and as the same object).
    palette = draw(st.lists(shapes(), min_size=1, max_size=5))
    teams = [f"t{i}" for i in range(draw(st.integers(1, 4)))]
    queued = []
    for i in range(draw(st.integers(0, 40))):
        base = draw(st.sampled_from(palette))
        copy = draw(st.booleans())
        shape = (
            ResourceShape(base.accelerator, tuple(base.groups), base.driver_cpus) if copy else base
        )
        queued.append(
            QueuedRun(f"q{i:03d}", draw(st.sampled_from(teams)), draw(st.integers(0, 2)), shape)
        )
    held = [
        HeldRun(
            f"h{i}",
            draw(st.sampled_from(teams)),
            draw(st.sampled_from(palette)),
            draw(st.booleans()),
        )
        for i in range(draw(st.integers(0, 6)))
    ]
    quotas = Quotas(
        {t: draw(st.sampled_from([0, 8, 16, 64])) for t in teams if draw(st.booleans())},
        default=draw(st.sampled_from([None, 32])),
    )
    limit = draw(st.sampled_from([None, 1, 3, 16]))
    return queued, held, Inventory(tuple(nodes)), quotas, limit


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rounds())
def test_the_fast_round_decides_as_the_straightforward_one(
    case: tuple[list[QueuedRun], list[HeldRun], Inventory, Quotas, int | None],
) -> None:
    queued, held, inventory, quotas, limit = case
    fast = decide(queued, held, inventory, quotas, limit)
    plain = admission_reference.decide(queued, held, inventory, quotas, limit)
    assert fast.order == plain.order
    assert fast.admit == plain.admit
    assert fast.reasons == plain.reasons
    assert fast.placements == plain.placements


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(SIZES.map(float), CPUS), max_size=10), shapes())
def test_a_pool_packs_the_same_after_a_take_as_a_fresh_pool_of_what_is_left(
    nodes: list[tuple[float, float]], shape: ResourceShape
) -> None:
    pool = Pool.of({f"n{i}": {"NPU": a, "CPU": c} for i, (a, c) in enumerate(nodes)})
    first = pack(shape, pool)  # the pool keeps what pack asked of it
    if first is None:
        return
    pool.take(first)
    fresh = Pool.of(dict(zip(pool.node_ids, pool.free, strict=True)))
    assert pack(shape, pool) == pack(shape, fresh)
