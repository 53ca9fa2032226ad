"""A key added to a section verl builds into a dataclass must be a field of that dataclass in
the verl version the service checks against; refusals name the version, never advise ``+key``."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

from fastapi.testclient import TestClient

from service.recipes.verl import typed_keys
from tests.test_verl_recipe import DATA, PRESET, build, refused

# verl's Megatron example, whose script sets megatron.grad_offload (gone in verl 0.9.1).
EXAMPLE = DATA / "verl_examples" / "geo3k_qwen3vl_30b_megatron_6_2_npu.json"
MEGATRON: dict[str, Any] = json.loads(EXAMPLE.read_text())["spec"]
GRAD_OFFLOAD = "actor_rollout_ref.actor.megatron.grad_offload"


def only(errors: list[dict[str, Any]]) -> dict[str, Any]:
    assert len(errors) == 1, errors
    return errors[0]


def test_adding_a_key_verl_0_9_1_removed_is_refused_naming_the_version(api: TestClient) -> None:
    overrides = [*MEGATRON.get("overrides", []), f"+{GRAD_OFFLOAD}=True"]
    resp = api.post("/runs", json={**MEGATRON, "overrides": overrides})
    assert resp.status_code == 422, resp.text
    error = only(resp.json()["errors"])
    assert error["field"] == f"overrides[{len(overrides) - 1}]"
    assert "verl 0.9.1" in error["msg"] and "McoreEngineConfig" in error["msg"]
    assert "'grad_offload'" in error["msg"] and "param_offload" in error["msg"]  # a close field
    assert f"write +{GRAD_OFFLOAD}" not in error["msg"]


def test_setting_a_removed_key_is_refused_without_advising_plus_key() -> None:
    overrides = [*MEGATRON.get("overrides", []), f"{GRAD_OFFLOAD}=True"]
    error = only(refused({**MEGATRON, "overrides": overrides}))
    assert error["field"] == f"overrides[{len(overrides) - 1}]" and "verl 0.9.1" in error["msg"]
    assert "+" + GRAD_OFFLOAD not in error["msg"]


def test_a_key_for_another_engine_is_refused_at_the_typed_section_it_lands_in() -> None:
    """Under FSDP the actor is an FSDPActorConfig, which has no megatron section at all."""
    error = only(refused({**PRESET, "overrides": [f"++{GRAD_OFFLOAD}=True"]}))
    assert "FSDPActorConfig" in error["msg"] and "'megatron'" in error["msg"]


def test_keys_under_open_sections_may_still_be_added() -> None:
    overrides = [
        "+actor_rollout_ref.rollout.engine_kwargs.vllm.enable_expert_parallel=True",
        "+actor_rollout_ref.model.override_config.attention_dropout=0.",
        "+reward.reward_kwargs.max_resp_len=6144",  # verl keeps `reward` as plain config
        "+data.extra_key=1",
    ]
    assert build({**PRESET, "overrides": overrides}).argv[-4:] == overrides


def test_a_plain_unknown_key_in_an_open_section_still_advises_plus_key() -> None:
    error = only(refused({**PRESET, "overrides": ["data.extra_key=1"]}))
    assert "+data.extra_key" in error["msg"]


def test_fields_are_read_from_verls_source_with_inherited_ones_and_no_torch() -> None:
    engine = typed_keys.fields_of("verl.workers.config.McoreEngineConfig")
    assert engine is not None and "param_offload" in engine and "grad_offload" not in engine
    actor = typed_keys.fields_of("verl.workers.config.FSDPActorConfig")
    # ppo_mini_batch_size comes from ActorConfig, _target_ from BaseConfig.
    assert actor is not None and {"ppo_mini_batch_size", "fsdp_config", "_target_"} <= actor
    assert typed_keys.fields_of("verl.workers.config.NoSuchConfig") is None
    # No torch: asked in a process of its own, since other tests may have imported it here.
    ask = (
        "import sys; from service.recipes.verl import typed_keys; "
        "typed_keys.fields_of('verl.workers.config.FSDPActorConfig'); print('torch' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", ask], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False", done.stderr
