"""The trainer stack checked before it runs: pairs known to break refused at submit and failed in
every node's preflight, versions off the tested pairing and keys that do nothing warned about,
and the table agreeing with the worker images' pins."""

from __future__ import annotations

import importlib.metadata
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from jobs.verl_launch import pairs
from jobs.verl_launch.__main__ import first_failure
from jobs.verl_launch.checks import check_node, stack
from service.app import create_app
from service.errors import InvalidSpec
from tests.conftest import make_settings
from tests.test_docker import WORKER_IMAGES, pins
from tests.test_verl_recipe import PRESET, SETTINGS, build


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    db = tmp_path_factory.mktemp("stack") / "db.sqlite"
    settings = make_settings(
        f"sqlite:///{db}",
        "http://127.0.0.1:9",
        run_loops=False,
    )
    with TestClient(create_app(settings)) as c:
        yield c


def test_an_npu_spec_on_verl_0_9_0_is_refused_naming_the_hccl_weight_sync_bug(
    client: TestClient,
) -> None:
    body = {**PRESET, "verl_version": "0.9.0"}
    resp = client.post("/runs", params={"dry_run": "true"}, json=body)
    assert resp.status_code == 422
    assert resp.headers["content-type"].startswith("application/problem+json")
    (error,) = resp.json()["errors"]
    assert error["field"] == "verl_version" and error["type"] == "stack_pair"
    assert "HCCL" in error["msg"] and "verl>=0.9.1" in error["msg"] and "#7487" in error["msg"]
    # The same release on GPU is not that pair: it is only off the tested one (refused later
    # only because 0.9.0 is not added here).
    gpu = {**PRESET, "verl_version": "0.9.0", "resources": {"accelerator": "gpu"}}
    (other,) = client.post("/runs", params={"dry_run": "true"}, json=gpu).json()["errors"]
    assert other["type"] == "unknown_verl_version"


def test_an_unknown_combination_is_a_warning_and_a_known_broken_pin_a_refusal() -> None:
    newer = SETTINGS.model_copy(update={"preflight_packages": ["torch-npu==2.10.0.post5"]})
    (warning,) = [w for w in build(PRESET, newer).warnings if "not known to work" in w]
    assert warning.startswith("resources.accelerator: torch-npu 2.10.0.post5 (tested: 2.10.0")
    assert not [w for w in build(PRESET, SETTINGS).warnings if "not known to work" in w]
    wrong = SETTINGS.model_copy(update={"preflight_packages": ["vllm==0.24.0"]})
    with pytest.raises(InvalidSpec) as info:
        build(PRESET, wrong)
    (error,) = info.value.extra["errors"]
    assert error["field"] == "resources.accelerator" and "vLLM-Ascend 0.23" in error["msg"]


def _fake_dist(root: Path, name: str, version: str) -> None:
    info = root / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")


def test_the_preflight_fails_a_node_whose_installed_pair_is_known_broken(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    site = tmp_path / "site"
    _fake_dist(site, "verl", "0.9.0")
    _fake_dist(site, "vllm-ascend", "0.23.0")
    cann = tmp_path / "cann.info"
    cann.write_text("package_name=Ascend-cann-toolkit\nversion=9.0.0\n")
    monkeypatch.setattr(sys, "path", [str(site), *sys.path])
    assert importlib.metadata.version("verl") == "0.9.0"
    names = {c["key"] for c in stack("npu", str(cann))}
    pause = "verl 0.9 x vLLM 0.32 pause_generation"  # beside this venv's vllm 0.32 (CPU)
    assert names == {
        "verl 0.9.0 HCCL weight sync",
        "vLLM-Ascend 0.23 x another vLLM",
        "vLLM-Ascend 0.23 x CANN before 9.0.1",
        pause,
    }
    checks = check_node({"stack": "npu", "check_devices": False}, declared=0)
    report = {"nodes": [{"node": "10.0.0.2", "node_id": "b" * 40, "checks": checks}]}
    said = first_failure(report)
    assert said.startswith("node 10.0.0.2 (bbbbbbbbbbbb): verl 0.9.0 is a stack pair known")
    assert "works: verl>=0.9.1" in said
    assert [c["key"] for c in stack("gpu", str(cann))] == [pause]  # the others are NPU's
    assert not stack("cpu")  # vllm 0.32 beside verl 0.9 is the CPU stack, whose shims cover it
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p != str(site)])
    left = [c["key"] for c in check_node({"stack": "npu"}, declared=0) if c["check"] == "pair"]
    assert left == [pause]
    assert not [c for c in check_node({"stack": ""}, declared=0) if c["check"] == "pair"]


def test_the_pair_table_and_the_worker_images_pins_agree() -> None:
    cann = re.search(
        r"FROM quay\.io/ascend/cann:([0-9.]+)-",
        (Path(__file__).parents[1] / "docker" / "Dockerfile.npu-worker").read_text(),
    )
    assert cann is not None
    for image in WORKER_IMAGES:
        accelerator = image.split("-", 1)[0]
        tested = dict(pairs.TESTED[accelerator])
        if accelerator == "npu":
            assert tested.pop(pairs.CANN) == cann.group(1)
        pinned = pins(image)
        assert {d: pinned[d] for d in tested} == tested, image
        assert not pairs.broken(accelerator, pairs.TESTED[accelerator]), image
    assert pairs.TESTED["npu"]["verl"] == importlib.metadata.version("verl")
    for row in pairs.BROKEN:
        assert row.source and row.works and row.symptom and set(row.accelerators) <= {"npu", "gpu"}
