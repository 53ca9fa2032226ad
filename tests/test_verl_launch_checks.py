"""The launcher's node checks and its command line, without Ray (one node: this machine)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from jobs.verl_launch import Plan
from jobs.verl_launch.__main__ import first_failure, split_argv
from jobs.verl_launch.checks import check_node


def test_paths_packages_and_devices_on_a_node(tmp_path: Path) -> None:
    (tmp_path / "train.parquet").write_bytes(b"PAR1")
    (tmp_path / "model").mkdir()
    plan: Plan = {
        "accelerator": "NPU",
        "check_devices": True,
        "files": [
            {"key": "data.train_files", "path": str(tmp_path / "train.parquet")},
            {"key": "data.val_files", "path": str(tmp_path / "nope.parquet")},
            {"key": "data.custom_cls.path", "path": "hdfs://x/ds.py"},  # not ours to check
        ],
        "dirs": [{"key": "actor_rollout_ref.model.path", "path": str(tmp_path / "train.parquet")}],
        "writable": [{"key": "trainer.default_local_dir", "path": str(tmp_path / "a" / "b")}],
        "packages": {"verl": "==0.9.1", "pytest": "<1", "no-such-dist": ""},
    }
    checks = {(c["check"], c["key"]): c for c in check_node(plan, declared=8)}
    assert checks[("file", "data.train_files")]["ok"]
    assert checks[("file", "data.val_files")]["reason"] == "does not exist"
    assert checks[("file", "data.custom_cls.path")]["ok"]
    assert checks[("dir", "actor_rollout_ref.model.path")]["reason"] == "is not a directory"
    assert checks[("write", "trainer.default_local_dir")]["ok"]  # its nearest parent takes files
    assert checks[("package", "verl")]["ok"] and checks[("package", "verl")]["target"] == "0.9.1"
    assert "the run was validated against pytest<1" in checks[("package", "pytest")]["reason"]
    assert checks[("package", "no-such-dist")]["reason"] == "is not installed"
    assert "Ray declares 8 NPU but the node has 0 devices" in checks[("devices", "NPU")]["reason"]
    assert not list(tmp_path.glob("**/.rlrun-preflight-*"))  # the write probe cleans up


def test_the_command_line_keeps_verls_argv_and_failures_name_node_and_path() -> None:
    argv = ["--plan", json.dumps({"files": []}), "--", "python3", "-m", "verl.x", "a='b c'", "--"]
    plan, command = split_argv(argv)
    assert plan == {"files": []} and command == ["python3", "-m", "verl.x", "a='b c'", "--"]
    with pytest.raises(SystemExit):
        split_argv(["python3", "-m", "verl.x"])
    report = {
        "nodes": [
            {"node": "10.0.0.1", "node_id": "a" * 40, "checks": [{"ok": True}]},
            {
                "node": "10.0.0.2",
                "node_id": "b" * 40,
                "checks": [
                    {"check": "file", "key": "data.train_files", "target": "/d/t.parquet",
                     "ok": False, "reason": "does not exist"},
                ],
            },
        ]
    }  # fmt: skip
    assert first_failure(report) == (
        "node 10.0.0.2 (bbbbbbbbbbbb): data.train_files /d/t.parquet does not exist"
    )
