"""Every resource pool verl builds from the config is counted in the run's shape, or refused."""

from __future__ import annotations

from collections import Counter

import pytest
from fastapi.testclient import TestClient

from tests.test_verl_recipe import PRESET, build, refused

RM = "reward.reward_model"
RM_POOL_8 = [
    f"{RM}.enable=True",
    f"{RM}.enable_resource_pool=True",
    f"{RM}.n_gpus_per_node=8",
    f"{RM}.nnodes=1",
    f"{RM}.model_path=/models/rm",
]


def roles(overrides: list[str]) -> Counter[tuple[str, int]]:
    shape = build({**PRESET, "overrides": overrides}).shape
    return Counter((g.role, g.accelerators) for g in shape.groups)


def test_the_preset_plus_a_reward_model_pool_of_8_holds_40_accelerators(api: TestClient) -> None:
    resp = api.post("/runs", params={"dry_run": "true"}, json={**PRESET, "overrides": RM_POOL_8})
    assert resp.status_code == 200, resp.text
    shape = resp.json()["shape"]
    assert shape["accelerators"] == 40
    # verl's default reward-model rollout has TP 2: four replicas, one placement group each.
    rm = [g for g in shape["groups"] if g["role"] == "reward_model"]
    assert [(g["accelerators"], g["cpus"]) for g in rm] == [(2, 4.0)] * 4


def test_the_legacy_reward_model_keys_count_the_same_pool() -> None:
    legacy = [o.replace(f"{RM}.", "reward_model.") for o in RM_POOL_8[:-1]]
    assert roles(legacy)[("reward_model", 2)] == 4
    assert build({**PRESET, "overrides": legacy}).shape.accelerators == 40


def test_a_reward_model_replica_spanning_nodes_holds_whole_nodes() -> None:
    overrides = [
        *RM_POOL_8[:2],
        f"{RM}.n_gpus_per_node=8",
        f"{RM}.nnodes=2",
        f"{RM}.rollout.tensor_model_parallel_size=16",
    ]
    assert roles(overrides)[("reward_model", 8)] == 2


def test_a_distillation_teacher_pool_is_one_group_per_node() -> None:
    overrides = [
        "distillation.enabled=True",
        "distillation.n_gpus_per_node=4",
        "distillation.nnodes=2",
    ]
    shape = build({**PRESET, "overrides": overrides}).shape
    assert shape.accelerators == 32 + 8
    assert [g.cpus for g in shape.groups if g.role == "teacher"] == [12.0, 12.0]


@pytest.mark.parametrize(
    ("overrides", "field", "words"),
    [
        # A colocated reward model: verl's fully async rollouter asserts a pool of its own.
        ([f"{RM}.enable=True"], "overrides", "enable_resource_pool"),
        # verl's default nnodes is 0: a pool of nothing would be admitted as free.
        ([*RM_POOL_8[:3], f"{RM}.nnodes=0"], "overrides[3]", "nnodes"),
        ([*RM_POOL_8[:4], f"{RM}.rollout.tensor_model_parallel_size=16"], "overrides[4]", "16"),
        (["distillation.enabled=True"], "overrides", "distillation.nnodes"),
        (
            ["actor_rollout_ref.rollout.disaggregation.enabled=True"],
            "overrides[0]",
            "disaggregat",
        ),
    ],
)
def test_a_pool_the_service_cannot_count_is_a_422_naming_the_field(
    overrides: list[str], field: str, words: str
) -> None:
    errors = refused({**PRESET, "overrides": overrides})
    assert any(e["field"] == field and words in e["msg"] for e in errors), errors


def test_no_reward_model_no_extra_groups() -> None:
    assert {role for role, _ in roles([])} == {"trainer", "rollout"}
