"""Keys verl never reads: ``+key`` on a node no dataclass describes is held against the keys
verl's own source reads (a scan of the installed wheel, kept per version)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from service.app import create_app
from service.errors import InvalidSpec
from service.recipes.base import Launch, LaunchContext
from service.recipes.registry import default_registry
from service.recipes.verl import hydra_check, read_keys
from service.settings import Settings
from tests.conftest import make_settings

PRESET = {"recipe": "verl-fully-async", "preset": "geo3k-qwen3vl-8b-npu"}


@pytest.fixture(scope="module")
def settings(tmp_path_factory: pytest.TempPathFactory) -> Settings:
    # One cache dir for the module: the installed verl is scanned once.
    return Settings(
        verl_data_dir="/mnt/data",
        verl_model_dir="/mnt/models",
        verl_checkpoint_root="/mnt/ckpt",
        verl_cache_dir=str(tmp_path_factory.mktemp("verl-cache")),
    )


def build(settings: Settings, *overrides: str) -> Launch:
    body = PRESET | {"overrides": list(overrides)}
    return default_registry("", settings).build(body, LaunchContext("run-x"))[1]


def unread(launch: Launch) -> list[str]:
    return [w for w in launch.warnings if "never reads" in w]


def test_a_typo_under_trainer_warns_naming_the_nearest_key(settings: Settings) -> None:
    (warning,) = unread(build(settings, "trainer.project_name=p", "+trainer.total_epoch=3"))
    assert warning.startswith("overrides[1]: verl 0.9.1 never reads 'trainer.total_epoch'")
    assert warning.endswith("did you mean trainer.total_epochs?")
    (warning,) = unread(build(settings, "+trainer.my_typo_key=1"))
    assert "'trainer.my_typo_key'" in warning and "did you mean trainer." in warning


def test_a_section_added_at_the_top_level_warns(settings: Settings) -> None:
    (warning,) = unread(build(settings, "+megatron.grad_offload=True"))
    assert "never reads 'megatron.grad_offload'" in warning and "the top level" in warning


def test_a_key_verl_reads_but_its_yaml_lacks_passes_silently(settings: Settings) -> None:
    key = "trainer.remove_previous_ckpt_in_save"
    base = hydra_check.base_config("fully_async_ppo_trainer")
    assert hydra_check.select(base, key, "<absent>") == "<absent>"  # only verl's source has it
    launch = build(settings, f"+{key}=False", "+data.apply_chat_template_kwargs={a: 1}")
    assert unread(launch) == []
    # An open mapping (verl passes it on whole) takes any key.
    assert unread(build(settings, "+reward.reward_kwargs.anything=1")) == []


def test_a_key_verl_removed_is_refused_under_its_field(settings: Settings) -> None:
    with pytest.raises(InvalidSpec) as info:
        build(settings, "trainer.project_name=p", "+trainer.use_legacy_worker_impl=disable")
    (error,) = info.value.extra["errors"]
    assert error["field"] == "overrides[1]"
    assert "verl removed 'trainer.use_legacy_worker_impl' in 0.8.0" in error["msg"]


def fake_verl(root: Path, version: str, source: str) -> Path:
    (root / "version").mkdir(parents=True)
    (root / "version" / "version").write_text(version)
    (root / "trainer.py").write_text(source)
    return root


def chains(scan: read_keys.Scan) -> set[tuple[str, ...]]:
    return {c for group in scan.groups for c in group}


def test_the_scan_is_kept_per_version(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = tmp_path / "cache"
    reads_alpha = "def main(config):\n    t = config.trainer\n    return t.get('alpha')\n"
    old = fake_verl(tmp_path / "a", "0.0.1", reads_alpha)
    new = fake_verl(tmp_path / "b", "0.0.2", "def main(cfg):\n    return cfg['trainer'].beta\n")
    assert ("trainer", "alpha") in chains(read_keys.scan(old, cache))
    assert ("trainer", "beta") in chains(read_keys.scan(new, cache))
    assert ("trainer", "beta") not in chains(read_keys.scan(old, cache))
    assert sorted(p.name for p in (cache / "read-keys").iterdir()) == ["0.0.1.json", "0.0.2.json"]
    # Another tree of a version scanned before is not read again: its scan is on disk.
    again = fake_verl(tmp_path / "c", "0.0.1", "def main(config):\n    return config.gamma\n")
    parsed: list[Any] = []
    monkeypatch.setattr(read_keys.ast, "parse", lambda *a, **k: parsed.append(a))
    assert ("trainer", "alpha") in chains(read_keys.scan(again, cache))
    assert parsed == []


def test_the_dry_run_answer_carries_the_warning(tmp_path: Path, settings: Settings) -> None:
    app_settings = make_settings(
        f"sqlite:///{tmp_path}/db.sqlite",
        "http://127.0.0.1:9",
        run_loops=False,
        verl_cache_dir=settings.verl_cache_dir,
    )
    body = PRESET | {"overrides": ["+trainer.total_epoch=3"]}
    with TestClient(create_app(app_settings)) as client:
        answer = client.post("/runs", params={"dry_run": True}, json=body)
    assert answer.status_code == 200, answer.text
    (warning,) = [w for w in answer.json()["warnings"] if "never reads" in w]
    assert warning.startswith("overrides[0]: ") and "trainer.total_epochs" in warning
