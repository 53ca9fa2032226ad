"""Keys and variables that do nothing on the stack a spec runs: warnings in the dry-run plan,
each checked against verl's own source at the pinned version."""

from __future__ import annotations

import importlib.metadata
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from service.app import create_app
from service.recipes.verl import dead_keys, overrides
from service.recipes.verl.spec import VerlFullyAsyncSpec
from tests.conftest import make_settings
from tests.test_verl_recipe import PRESET

VERL = Path(importlib.metadata.distribution("verl").locate_file("verl"))


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    db = tmp_path_factory.mktemp("dead-keys") / "db.sqlite"
    settings = make_settings(
        f"sqlite:///{db}",
        "http://127.0.0.1:9",
        run_loops=False,
        env_allow="RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES",
    )
    with TestClient(create_app(settings)) as c:
        yield c


def test_keys_that_do_nothing_warn_in_the_dry_run_plan(client: TestClient) -> None:
    body = {
        **PRESET,
        "overrides": ["actor_rollout_ref.nccl_timeout=7200"],
        "runtime_env": {
            "env_vars": {
                "VLLM_ASCEND_ENABLE_FLASHCOMM1": "1",
                "VLLM_ASCEND_ENABLE_FLASHCOMM": "1",
                "RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES": "1",
            }
        },
    }
    resp = client.post("/runs", params={"dry_run": "true"}, json=body)
    assert resp.status_code == 200, resp.text
    warnings = resp.json()["warnings"]
    said = {w.split(":", 1)[0]: w for w in warnings}
    assert "HCCL_EXEC_TIMEOUT and HCCL_CONNECT_TIMEOUT" in said["overrides[0]"]
    assert "verl #7815" in said["overrides[0]"]
    assert (
        "additional_config.enable_flashcomm1"
        in said["runtime_env.env_vars.VLLM_ASCEND_ENABLE_FLASHCOMM1"]
    )
    assert "not read" in said["runtime_env.env_vars.VLLM_ASCEND_ENABLE_FLASHCOMM"]
    noset = "runtime_env.env_vars.RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES"
    assert "verl #7507" in said[noset]
    # The Megatron critic's own key (FSDP's critic has none: verl refuses it there).
    megatron = overrides.read("critic.nccl_timeout=7200", ("overrides", 0))
    spec = VerlFullyAsyncSpec.model_validate({"recipe": "verl-fully-async"})
    (critic,) = dead_keys.warnings([megatron], spec, "0.9.1")
    assert critic.startswith("overrides[0]: critic.nccl_timeout does nothing in verl 0.9.0-0.9.1")
    assert not dead_keys.warnings([megatron], spec, "0.9.2")  # not known dead there
    plain = client.post("/runs", params={"dry_run": "true"}, json=PRESET).json()["warnings"]
    assert not [w for w in plain if "7815" in w or "FLASHCOMM" in w or "7507" in w]


def test_the_dead_keys_are_dead_in_the_installed_verl() -> None:
    """Against verl's own source at the pinned version: the key is in its config, nothing reads
    it, and the engine workers start their process group with no timeout."""
    assert dead_keys.DEAD_KEYS[0].verl and importlib.metadata.version("verl") == "0.9.1"
    assert "nccl_timeout:" in (VERL / "trainer" / "config" / "ppo_trainer.yaml").read_text()
    readers = [p for p in VERL.rglob("*.py") if "nccl_timeout" in p.read_text(errors="replace")]
    assert [p.relative_to(VERL).as_posix() for p in readers] == ["workers/config/critic.py"]
    workers = (VERL / "workers" / "engine_workers.py").read_text()
    assert "initialize_global_process_group_ray(timeout_second=None)" in workers
    worker = (VERL / "single_controller" / "base" / "worker.py").read_text()
    assert "get_accelerator_ids()[device_name][0]" in worker  # verl #7507's path, unfixed
