"""Every path a verl spec sets is pinned: relative (the run's files, a hub id), under the run's
own directory, or under an operator's data root; never another run's checkpoints, never a
home directory, a free absolute path or a URI outside the roots. A 422 at the field."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from service.errors import InvalidSpec
from service.settings import Settings
from tests.test_verl_recipe import PRESET, SETTINGS, build

OWN = "/mnt/ckpt/run-x"  # the run's own directory under SETTINGS


def refusal(body: dict[str, Any], settings: Settings = SETTINGS) -> dict[str, Any]:
    with pytest.raises(InvalidSpec) as info:
        build(PRESET | body, settings)
    [error] = info.value.extra["errors"]
    assert error["type"] == "forbidden_path"
    return dict(error)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"trainer": {"resume_mode": "resume_path",
                      "resume_from_path": "/mnt/ckpt/other-run/global_step_10"}},
         "trainer.resume_from_path"),
        ({"overrides": ["trainer.resume_from_path=/mnt/ckpt/other-run"]}, "overrides[0]"),
        ({"data": {"train_files": "/etc/passwd"}}, "data.train_files"),
        ({"data": {"val_files": ["/mnt/data/ok.parquet", "/root/.ssh/id_rsa"]}},
         "data.val_files"),
        ({"model": {"path": "/home/alice/model"}}, "model.path"),
        ({"model": {"path": "~/models/x"}}, "model.path"),
        ({"overrides": ["global_profiler.save_path=/var/tmp/prof"]}, "overrides[0]"),
        ({"overrides": ["actor_rollout_ref.actor.profiler.save_path=/tmp/p"]}, "overrides[0]"),
        ({"overrides": ["+trainer.default_hdfs_dir=hdfs://evil/drop"]}, "overrides[0]"),
        ({"overrides": ["+data.custom={path: /etc/shadow}"]}, "overrides[0]"),
        ({"overrides": ["+data.anything=/etc/shadow"]}, "overrides[0]"),  # any absolute path
        ({"overrides": ["+custom_reward_function.path=file:///etc/passwd"]}, "overrides[0]"),
        ({"data": {"train_files": "/mnt/database/x.parquet"}}, "data.train_files"),  # not /mnt/data
    ],
)  # fmt: skip
def test_unpinned_paths_are_refused_at_their_field(body: dict[str, Any], field: str) -> None:
    assert refusal(body)["field"] == field


def test_another_runs_checkpoints_are_named_as_such() -> None:
    msg = refusal({"trainer": {"resume_from_path": "/mnt/ckpt/run-y/global_step_1"}})["msg"]
    assert "another run's checkpoints" in msg


@pytest.mark.parametrize(
    "body",
    [
        {"trainer": {"resume_mode": "resume_path", "resume_from_path": f"{OWN}/global_step_10"}},
        {"overrides": [f"global_profiler.save_path={OWN}/profile"]},
        {"data": {"train_files": "/mnt/data/geo3k/other.parquet"}},
        {"model": {"path": "Qwen/Qwen3-VL-8B-Instruct"}},  # a hub id
        {"overrides": ["+custom_reward_function.path=reward.py"], "files": {"reward.py": "x=1"}},
    ],
)
def test_pinned_paths_pass(body: dict[str, Any]) -> None:
    build(PRESET | body)


def test_an_operator_data_root_widens_the_pins_but_never_to_other_runs() -> None:
    body = {"data": {"train_files": "/shared/datasets/a.parquet"}}
    refusal(body)
    widened = SETTINGS.model_copy(update={"data_roots": ["/shared/datasets", "hdfs://nn/data"]})
    build(PRESET | body, widened)
    build(PRESET | {"data": {"train_files": "hdfs://nn/data/a.parquet"}}, widened)
    refusal({"data": {"train_files": "hdfs://nn/database/a.parquet"}}, widened)
    refusal({"data": {"train_files": "hdfs://nn/data/../x.parquet"}}, widened)
    everything = SETTINGS.model_copy(update={"data_roots": ["/"]})
    build(PRESET | {"data": {"train_files": "/anywhere/a.parquet"}}, everything)
    assert (
        "another run's"
        in refusal({"trainer": {"resume_from_path": "/mnt/ckpt/run-y"}}, everything)["msg"]
    )


@pytest.mark.parametrize("root", ["relative/dir", "/data/../etc", ""])
def test_data_roots_are_absolute(root: str) -> None:
    with pytest.raises(ValueError):
        Settings(data_roots=[root])


def test_the_reference_preset_is_valid_with_default_settings(api: TestClient) -> None:
    resp = api.post("/runs", params={"dry_run": True}, json=PRESET)
    assert resp.status_code == 200, resp.text
    bad = api.post(
        "/runs",
        params={"dry_run": True},
        json=PRESET | {"trainer": {"resume_from_path": "/checkpoints/someone-else"}},
    )
    assert bad.status_code == 422
    assert [e["field"] for e in bad.json()["errors"]] == ["trainer.resume_from_path"]
