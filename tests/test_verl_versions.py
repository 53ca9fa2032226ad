"""Several verl versions side by side: ``rlrun verl add`` caches a release's wheel, a spec names
``verl_version`` and is validated against that release's own config, and the preflight pins the
nodes to it. Downloads verl 0.9.0's wheel (no dependencies) from the package index."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from service import cli
from service.app import create_app
from service.errors import InvalidSpec
from tests.conftest import make_settings
from tests.test_verl_recipe import PRESET, SETTINGS, build

pytestmark = pytest.mark.slow
# A key verl 0.9.1 added to its FSDP engine config; 0.9.0 has no such field.
NEW_IN_0_9_1 = "actor_rollout_ref.actor.fsdp_config.use_no_sync_for_gradient_accumulation=True"


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cache = tmp_path_factory.mktemp("verl-cache")
    env = {"RLRUN_VERL_CACHE_DIR": str(cache)}
    result = CliRunner().invoke(cli.app, ["verl", "add", "0.9.0"], env=env)
    assert result.exit_code == 0, result.output
    assert (cache / "0.9.0" / "verl" / "version" / "version").read_text().strip() == "0.9.0"
    return cache


# verl 0.9.0 on NPU is a stack pair known to break (tests/test_stack_pairs.py): on GPU here.
GPU = {**PRESET, "resources": {"accelerator": "gpu"}}


def test_a_spec_valid_on_one_verl_version_is_refused_on_another(cache: Path) -> None:
    settings = SETTINGS.model_copy(update={"verl_cache_dir": str(cache)})
    body = {**GPU, "overrides": [NEW_IN_0_9_1]}
    assert NEW_IN_0_9_1 in build(body, settings).argv  # the default, 0.9.1
    with pytest.raises(InvalidSpec) as info:
        build({**body, "verl_version": "0.9.0"}, settings)
    (error,) = info.value.extra["errors"]
    assert error["field"] == "overrides[0]" and "verl 0.9.0" in error["msg"]
    assert "+actor_rollout_ref" not in error["msg"]


def test_the_preflight_pins_the_nodes_to_the_version_the_spec_names(cache: Path) -> None:
    settings = SETTINGS.model_copy(update={"verl_cache_dir": str(cache)})
    launch = build({**GPU, "verl_version": "0.9.0"}, settings)
    assert any("verl 0.9.0 (tested: 0.9.1) on gpu" in w for w in launch.warnings)
    argv = launch.argv
    plan = json.loads(argv[argv.index("--plan") + 1])
    assert plan["packages"]["verl"] == "==0.9.0"
    assert plan["packages"]["transformers"]  # 0.9.0's own declared range, from its wheel


@pytest.fixture
def client(cache: Path, db_url: str) -> Iterator[TestClient]:
    settings = make_settings(
        db_url, "http://127.0.0.1:9", run_loops=False, verl_cache_dir=str(cache)
    )
    with TestClient(create_app(settings)) as c:
        yield c


def test_the_versions_are_listed_and_an_unknown_one_is_a_422(client: TestClient) -> None:
    listed = client.get("/verl/versions").json()
    assert listed["default"] == "0.9.1"
    assert [(v["version"], v["source"]) for v in listed["versions"]] == [
        ("0.9.0", "cache"),
        ("0.9.1", "installed"),
    ]
    resp = client.post(
        "/runs", params={"dry_run": "true"}, json={**PRESET, "verl_version": "0.8.0"}
    )
    assert resp.status_code == 422
    (error,) = resp.json()["errors"]
    assert error["field"] == "verl_version" and "rlrun verl add 0.8.0" in error["msg"]
