"""The verl accept path as one pipeline: each override string meets Hydra's parser once."""

from __future__ import annotations

import sys
from collections import Counter
from typing import Any

import pytest

from service.recipes.base import LaunchContext
from service.recipes.registry import default_registry
from service.recipes.verl import hydra_check
from service.settings import Settings

PRESET = {"recipe": "verl-fully-async", "preset": "geo3k-qwen3vl-8b-npu"}
SETTINGS = Settings(
    verl_data_dir="/mnt/data", verl_model_dir="/mnt/models", verl_checkpoint_root="/mnt/ckpt"
)


def test_each_override_is_parsed_exactly_once_per_accept(monkeypatch: pytest.MonkeyPatch) -> None:
    real = hydra_check.parse
    counts: Counter[str] = Counter()

    def counted(text: str) -> Any:
        counts[text] += 1
        return real(text)

    # Wherever the parser is reachable from the recipe's modules, calls are counted.
    for name, module in list(sys.modules.items()):
        if name.startswith("service.recipes.verl") and getattr(module, "parse", None) is real:
            monkeypatch.setattr(module, "parse", counted)
    body = PRESET | {
        "overrides": [
            "trainer.project_name=p",
            "model_engine=dp",
            "+trainer.remove_previous_ckpt_in_save=False",
        ]
    }
    launch = default_registry("", SETTINGS).build(body, LaunchContext("run-once"))[1]
    verl_argv = launch.argv[launch.argv.index("--") + 1 :]
    hydra_overrides = verl_argv[5:]
    assert "trainer.project_name=p" in hydra_overrides and len(hydra_overrides) > 20
    # A value's rendering is checked as ``k=<value>`` (command.hydra_value); not an override.
    parsed = {text: n for text, n in counts.items() if not text.startswith("k=")}
    assert parsed == dict.fromkeys(hydra_overrides, 1)
