"""Packing shapes onto nodes: hand-picked shapes and property-based checks against brute force."""

from __future__ import annotations

import itertools
from collections import defaultdict

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from service.errors import InvalidSpec
from service.scheduling.fit import never_fits, suggest
from service.scheduling.inventory import Inventory, Node
from service.scheduling.placement import Placement, Pool, pack
from service.scheduling.shape import Group, ResourceShape


def pool(*nodes: tuple[float, float]) -> Pool:
    return Pool.of({f"n{i}": {"NPU": a, "CPU": c} for i, (a, c) in enumerate(nodes)})


def shape(*groups: tuple[int, float], driver_cpus: float = 0.0) -> ResourceShape:
    return ResourceShape(
        "NPU", tuple(Group(f"g{i}", a, c) for i, (a, c) in enumerate(groups)), driver_cpus
    )


def verl_like(n_nodes: int, per_node: int, rollout: tuple[int, int] = (0, 0)) -> ResourceShape:
    trainer = tuple(
        Group(
            "trainer",
            per_node,
            3.0 * per_node,
            "resources.n_gpus_training",
            "resources.n_nodes_train",
        )
        for _ in range(n_nodes)
    )
    replicas, tp = rollout
    rollouts = tuple(
        Group("rollout", tp, 2.0 * tp, "resources.n_gpus_rollout") for _ in range(replicas)
    )
    return ResourceShape("NPU", trainer + rollouts, driver_cpus=23.0)


def inventory(*nodes: tuple[float, float]) -> Inventory:
    return Inventory(
        tuple(
            Node(f"n{i}", {"NPU": a, "CPU": c}, {"NPU": a, "CPU": c})
            for i, (a, c) in enumerate(nodes)
        )
    )


def valid(placement: Placement, s: ResourceShape, p: Pool) -> bool:
    """Every group on exactly one node, no node over its free resources, driver CPUs all placed."""
    used: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    groups = sorted(
        (slot.accelerators, slot.cpus) for slot in placement.slots if slot.role != "driver"
    )
    if groups != sorted((g.accelerators, g.cpus) for g in s.groups):
        return False
    for slot in placement.slots:
        used[slot.node][0] += slot.accelerators
        used[slot.node][1] += slot.cpus
    driver = sum(slot.cpus for slot in placement.slots if slot.role == "driver")
    free = dict(zip(p.node_ids, p.free, strict=True))
    return abs(driver - s.driver_cpus) < 1e-6 and all(
        a <= free[n]["NPU"] + 1e-6 and c <= free[n]["CPU"] + 1e-6 for n, (a, c) in used.items()
    )


def brute_force_fits(s: ResourceShape, p: Pool) -> bool:
    nodes = [(r["NPU"], r["CPU"]) for r in p.free]
    for choice in itertools.product(range(len(nodes)), repeat=len(s.groups)):
        left = [list(n) for n in nodes]
        for g, node in zip(s.groups, choice, strict=True):
            left[node][0] -= g.accelerators
            left[node][1] -= g.cpus
        if all(a >= 0 and c >= 0 for a, c in left) and sum(c for _, c in left) >= s.driver_cpus:
            return True
    return False


def test_sixteen_on_one_node_never_fits_eight_npu_nodes_but_two_by_eight_does() -> None:
    nodes = pool((8, 64), (8, 64))
    assert pack(verl_like(1, 16), nodes) is None
    placed = pack(verl_like(2, 8), nodes)
    assert placed is not None and valid(placed, verl_like(2, 8), nodes)
    assert {s.node for s in placed.slots if s.role == "trainer"} == {"n0", "n1"}


def test_driver_cpus_may_be_split_over_nodes_but_groups_may_not() -> None:
    nodes = pool((8, 10), (8, 10))
    placed = pack(shape((8, 6), (8, 6), driver_cpus=8), nodes)
    assert placed is not None
    assert sorted(s.cpus for s in placed.slots if s.role == "driver") == [4.0, 4.0]
    assert pack(shape((8, 6), (8, 6), driver_cpus=8.5), nodes) is None
    assert pack(shape((4, 11)), nodes) is None  # CPUs of one group must sit on one node too


def test_a_group_goes_to_the_node_it_fits_best_leaving_whole_nodes_free() -> None:
    nodes = pool((8, 32), (4, 32), (8, 32))
    placed = pack(shape((4, 1)), nodes)
    assert placed is not None and [s.node for s in placed.slots] == ["n1"]


def test_mixed_groups_fill_fragmented_nodes_exactly() -> None:
    nodes = pool((6, 6), (6, 6))
    s = shape((3, 1), (3, 1), (2, 1), (2, 1), (2, 1))
    placed = pack(s, nodes)
    assert placed is not None and valid(placed, s, nodes)


def test_an_empty_cluster_fits_only_shapes_without_groups_or_cpus() -> None:
    assert pack(shape((1, 0)), pool()) is None
    assert pack(ResourceShape("NPU", (), 0.0), pool()) is not None


def test_gpu_shapes_use_gpu_not_npu() -> None:
    nodes = Pool.of({"n0": {"NPU": 8, "CPU": 8}, "n1": {"GPU": 4, "CPU": 8}})
    placed = pack(ResourceShape("GPU", (Group("t", 4, 1),), 0.0), nodes)
    assert placed is not None and placed.slots[0].node == "n1"
    assert pack(ResourceShape("GPU", (Group("t", 8, 1),), 0.0), nodes) is None


def test_a_shape_read_back_is_equal_and_one_object_per_distinct_shape() -> None:
    trainer = Group("trainer", 8, 24.0, "trainer.n_npus_per_node", "trainer.nnodes")
    shape = ResourceShape("NPU", (trainer, trainer, Group("rollout", 4, 8.0)), 2.0)
    first, again = (ResourceShape.from_dict(shape.as_dict()) for _ in range(2))
    assert first == shape and first is again and first.accelerators == 20
    other = ResourceShape.from_dict(ResourceShape("GPU", (trainer,), 2.0).as_dict())
    assert other != first and other.accelerator == "GPU" and other.groups == (trainer,)
    with pytest.raises(TypeError):
        ResourceShape.from_dict({**shape.as_dict(), "groups": [{"role": "x", "npus": 1}]})


node_st = st.tuples(st.integers(0, 8), st.integers(0, 8))
group_st = st.tuples(st.integers(1, 8), st.integers(0, 4))


@settings(max_examples=300, deadline=None)
@given(
    nodes=st.lists(node_st, min_size=1, max_size=4),
    groups=st.lists(group_st, max_size=5),
    driver=st.integers(0, 4),
)
def test_pack_finds_a_valid_placement_exactly_when_one_exists(
    nodes: list[tuple[int, int]], groups: list[tuple[int, int]], driver: int
) -> None:
    p = pool(*nodes)
    s = shape(*groups, driver_cpus=driver)
    placed = pack(s, p)
    assert (placed is not None) == brute_force_fits(s, p)
    if placed is not None:
        assert valid(placed, s, p)


@settings(max_examples=100, deadline=None)
@given(
    n=st.integers(1, 100),
    per_node=st.sampled_from([8, 16]),
    groups=st.lists(st.sampled_from([1, 2, 4, 8, 16]), max_size=24),
)
def test_pack_on_large_clusters_is_valid_and_never_misses_uniform_shapes(
    n: int, per_node: int, groups: list[int]
) -> None:
    p = pool(*[(per_node, 4 * per_node)] * n)
    s = shape(*[(g, 2 * g) for g in groups])
    placed = pack(s, p)
    if placed is not None:
        assert valid(placed, s, p)
    if all(g == per_node for g in groups):
        # Whole-node groups: fits exactly when there are enough nodes.
        assert (placed is not None) == (len(groups) <= n)


def test_taking_a_placement_leaves_the_rest_free() -> None:
    nodes = pool((8, 64), (8, 64))
    placed = pack(verl_like(1, 8), nodes)
    assert placed is not None
    nodes.take(placed)
    assert sum(r["NPU"] for r in nodes.free) == 8 and pack(verl_like(2, 8), nodes) is None
    assert pack(verl_like(1, 8), nodes) is not None


@pytest.mark.parametrize(
    ("nodes", "s", "expected"),
    [
        (
            [(8, 64)] * 2,
            verl_like(1, 16),
            {"resources.n_nodes_train": 2, "resources.n_gpus_training": 8},
        ),
        (
            [(8, 64)] * 4,
            verl_like(2, 16),
            {"resources.n_nodes_train": 4, "resources.n_gpus_training": 8},
        ),
        (
            [(4, 64)] * 4,
            verl_like(1, 12),
            {"resources.n_nodes_train": 3, "resources.n_gpus_training": 4},
        ),
        ([(8, 64)] * 2, verl_like(1, 32), {}),  # 32 NPUs are more than the cluster has
    ],
)
def test_suggestion_splits_an_oversized_group_into_nodes_that_fit(
    nodes: list[tuple[int, int]], s: ResourceShape, expected: dict[str, int]
) -> None:
    assert suggest(s, pool(*nodes)) == expected


def test_a_shape_that_never_fits_is_a_422_naming_the_field_with_the_suggestion() -> None:
    refusal = never_fits(verl_like(1, 16, (2, 4)), inventory((8, 64), (8, 64), (8, 64)), "t", None)
    assert isinstance(refusal, InvalidSpec) and refusal.status == 422
    body = refusal.body()
    assert [e["field"] for e in body["errors"]] == ["resources.n_gpus_training"]
    assert body["suggestion"] == {"resources.n_nodes_train": 2, "resources.n_gpus_training": 8}
    assert "resources.n_nodes_train=2, resources.n_gpus_training=8" in body["detail"]


def test_a_shape_larger_than_the_cluster_names_its_count_field() -> None:
    refusal = never_fits(verl_like(3, 8), inventory((8, 64), (8, 64)), "t", None)
    assert refusal is not None
    assert [e["field"] for e in refusal.body()["errors"]] == ["resources.n_nodes_train"]


def test_a_shape_over_its_team_quota_is_refused_and_one_that_fits_passes() -> None:
    inv = inventory((8, 64), (8, 64))
    refusal = never_fits(verl_like(2, 8), inv, "vision", 8)
    assert refusal is not None and "quota" in refusal.detail
    assert never_fits(verl_like(2, 8), inv, "vision", 16) is None
    assert never_fits(verl_like(2, 8), Inventory(()), "vision", None) is None  # unknown cluster
