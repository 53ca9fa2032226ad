"""verl's V1 trainer as the verl recipe's second mode (``trainer_mode: separate_async``): the
launch verl's own Hydra composes, and the rules verl 0.9.1's V1 trainer asserts at start,
refused at submit with the field that broke each."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from service.errors import InvalidSpec
from service.metrics.keys import TRAINER_STEP_KEY
from service.recipes.base import Launch, LaunchContext
from service.recipes.registry import default_registry
from service.recipes.verl import hydra_check
from service.recipes.verl.command import V1_MODULE
from service.recipes.verl.preset import CPU_OVERRIDES
from service.settings import Settings
from tests.conftest import assert_refused_naming

SETTINGS = Settings(verl_data_dir="/mnt/data", verl_checkpoint_root="/mnt/ckpt")
V1 = {"recipe": "verl-fully-async", "preset": "cpu-smoke-v1"}
# The preset's own overrides: a request's list replaces them, so a test adds to them.
PRESET_OVERRIDES = [
    *CPU_OVERRIDES,
    "transfer_queue.backend.SimpleStorage.num_data_storage_units=1",
    "actor_rollout_ref.rollout.agent.num_workers=1",
    "reward.num_workers=1",
]


def build(body: dict[str, Any]) -> Launch:
    registry = default_registry((), SETTINGS)
    return registry.build(body, LaunchContext("run-v1", stop_grace_s=300))[1]


def verl_argv(launch: Launch) -> list[str]:
    return launch.argv[launch.argv.index("--") + 1 :]


def overrides_of(launch: Launch) -> dict[str, Any]:
    parsed = [hydra_check.parse(o) for o in verl_argv(launch)[5:]]
    return {p.key: p.value for p in parsed}


def test_cpu_smoke_v1_runs_verls_v1_entry_point_in_separate_async_mode() -> None:
    launch = build(V1)
    argv = verl_argv(launch)
    assert argv[:5] == [
        "python3", "-m", V1_MODULE, "--config-path=config", "--config-name=ppo_trainer.yaml",
    ]  # fmt: skip
    ours = overrides_of(launch)
    assert ours["trainer.use_v1"] is True
    assert ours["trainer.v1.trainer_mode"] == "separate_async"
    assert ours["trainer.v1.separate_async.parameter_sync_step"] == 2
    assert ours["trainer.v1.sampler.max_off_policy_threshold"] == 2
    # train_batch_size = parameter_sync_step x ppo_mini_batch_size, derived when unset.
    assert ours["actor_rollout_ref.actor.ppo_mini_batch_size"] == 2
    assert ours["data.train_batch_size"] == 4
    # The V1 trainer's rollout pool, and none of fully_async_policy's keys.
    assert ours["actor_rollout_ref.rollout.nnodes"] == 1
    assert ours["actor_rollout_ref.rollout.n_gpus_per_node"] == 1
    assert not [k for k in ours if k.startswith(("async_training.", "rollout."))]
    assert "data.gen_batch_size" not in ours
    assert ours["actor_rollout_ref.rollout.checkpoint_engine.backend"] == "file"
    # Progress: one weight sync a trainer step, read from the V1 trainer's own step key.
    assert launch.total_steps == 2 and launch.progress_key == TRAINER_STEP_KEY
    assert launch.samples_per_sync is None
    assert not any("retires the fully_async_policy" in w for w in launch.warnings)


def test_v1_argv_composes_in_verls_own_config_as_hydra_composes_it() -> None:
    from hydra import compose, initialize_config_dir

    root = hydra_check.verl_root()
    # Built first: building composes with Hydra too, and Hydra's state is process-wide.
    overrides = verl_argv(build(V1))[5:]
    with initialize_config_dir(str(root / hydra_check.TRAINER_CONFIG), version_base=None):
        cfg = compose("ppo_trainer", overrides=overrides)
    assert cfg.trainer.use_v1 is True and cfg.trainer.v1.trainer_mode == "separate_async"
    sync = cfg.trainer.v1.separate_async.parameter_sync_step
    assert cfg.data.train_batch_size == sync * cfg.actor_rollout_ref.actor.ppo_mini_batch_size


def test_the_v1_batch_follows_parameter_sync_step_and_the_mini_batch() -> None:
    launch = build(V1 | {"v1": {"parameter_sync_step": 3}, "actor": {"ppo_mini_batch_size": 4}})
    assert overrides_of(launch)["data.train_batch_size"] == 12


def with_override(text: str) -> dict[str, Any]:
    return {"overrides": [*PRESET_OVERRIDES, text]}


AT = f"overrides[{len(PRESET_OVERRIDES)}]"
# One case per rule of verl's V1 trainer (and of the service's pools), with the field named.
V1_RULES = [
    ({"data": {"train_batch_size": 6}}, "data.train_batch_size"),
    (with_override("data.train_batch_size=8"), AT),
    (with_override("trainer.v1.separate_async.parameter_sync_step=3"), "data.train_batch_size"),
    ({"async_training": {"staleness_threshold": 0.1}}, "async_training.staleness_threshold"),
    ({"rollout": {"total_rollout_steps": 8}}, "rollout.total_rollout_steps"),
    ({"data": {"gen_batch_size": 1}}, "data.gen_batch_size"),
    ({"v1": {"max_off_policy_threshold": 0}}, "v1.max_off_policy_threshold"),
    ({"v1": {"max_off_policy_strategy": "keep"}}, "v1.max_off_policy_strategy"),
    (with_override("trainer.v1.sampler.max_off_policy_threshold=0"), AT),
    (with_override("trainer.v1.sampler.max_off_policy_strategy=keep"), AT),
    (with_override("actor_rollout_ref.rollout.checkpoint_engine.backend=naive"), AT),
    (with_override("trainer.v1.trainer_mode=colocate_async"), AT),
    (with_override("trainer.use_v1=False"), AT),
    (with_override("actor_rollout_ref.rollout.nnodes=2"), AT),
    ({"actor": {"hybrid_engine": True}}, "actor.hybrid_engine"),
]


@pytest.mark.parametrize(("patch", "field"), V1_RULES)
def test_a_v1_rule_broken_is_refused_naming_its_field(patch: dict[str, Any], field: str) -> None:
    with pytest.raises((InvalidSpec, ValueError)) as info:
        build(V1 | patch)
    if isinstance(info.value, InvalidSpec):
        errors = info.value.extra["errors"]
        assert field in {e["field"] for e in errors}, errors
    else:  # the spec model's own bounds (pydantic)
        assert field.split(".")[-1] in str(info.value)


def test_the_fully_async_mode_refuses_the_v1_block() -> None:
    with pytest.raises(InvalidSpec) as info:
        build(
            {"recipe": "verl-fully-async", "preset": "cpu-smoke", "v1": {"parameter_sync_step": 1}}
        )
    assert {e["field"] for e in info.value.extra["errors"]} == {"v1.parameter_sync_step"}


def test_the_retiring_path_names_the_v1_mode_and_its_spec_fields() -> None:
    warnings = build({"recipe": "verl-fully-async", "preset": "cpu-smoke"}).warnings
    (warning,) = [w for w in warnings if "retires the fully_async_policy" in w]
    assert "trainer_mode=separate_async" in warning
    assert "v1.parameter_sync_step=1" in warning and "v1.max_off_policy_threshold" in warning


@pytest.mark.parametrize(
    ("patch", "field"),
    [
        ({"data": {"train_batch_size": 6}}, "data.train_batch_size"),
        ({"async_training": {"require_batches": 2}}, "async_training.require_batches"),
        ({"v1": {"parameter_sync_step": 0}}, "v1.parameter_sync_step"),
        ({"trainer_mode": "colocate_async"}, "trainer_mode"),
    ],
)  # fmt: skip
def test_api_refuses_a_bad_v1_spec_with_problem_json_naming_the_field(
    api: TestClient, patch: dict[str, Any], field: str
) -> None:
    resp = api.post("/runs", json=V1 | patch)
    assert_refused_naming(resp, field)
    assert api.get("/runs").json()["items"] == []


def test_api_takes_the_v1_preset_and_shows_its_progress_key(api: TestClient) -> None:
    resp = api.post("/runs", json=V1 | {"name": "v1"})
    assert resp.status_code in (200, 201, 202), resp.text
    run = api.get(f"/runs/{resp.json()['id']}").json()
    assert "trainer.v1.trainer_mode=separate_async" in run["command"]
    assert run["progress"]["key"] == TRAINER_STEP_KEY
    assert run["progress"]["total_steps"] == 2
    assert V1_MODULE in run["command"]
    listed = api.get("/runs").json()["items"]
    assert [r["progress"]["key"] for r in listed] == [TRAINER_STEP_KEY]


def test_the_v1_config_dir_is_verls_trainer_config() -> None:
    assert (hydra_check.verl_root() / hydra_check.TRAINER_CONFIG / "ppo_trainer.yaml").is_file()
    fully_async = hydra_check.verl_root() / hydra_check.FULLY_ASYNC_CONFIG
    assert not Path(fully_async / "ppo_trainer.yaml").exists()


def test_async_save_on_v1_is_warned_that_its_own_auto_resume_restarts_from_step_0() -> None:
    # verl 0.9.1's V1 trainer skips the tracker when async_save is set (trainer_base.py),
    # whatever the strategy; its fully async trainer writes it (test_verl_recipe).
    saving = V1 | {
        "overrides": [*PRESET_OVERRIDES, "actor_rollout_ref.actor.checkpoint.async_save=True"]
    }
    (warned,) = [w for w in build(saving).warnings if "#7952" in w]
    assert "V1 trainer then skips latest_checkpointed_iteration.txt" in warned
    assert not any("#7952" in w for w in build(V1).warnings)
