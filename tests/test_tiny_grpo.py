"""tiny-grpo's recipe (shape, argv, validation) and its GRPO pieces (advantages, correction)."""

from __future__ import annotations

import numpy as np
import pytest
from fastapi.testclient import TestClient

from jobs.tiny_grpo.actors import TinyGrpoRollouter, TinyGrpoTrainer, console_line
from jobs.tiny_grpo.policy import Batch, Correction, Weights, group_advantages, update
from jobs.tiny_grpo.task import score
from service.metrics.parse import parse_line


def test_the_plan_places_a_trainer_and_a_rollout_group_on_virtual_npus(api: TestClient) -> None:
    spec = {"recipe": "tiny-grpo", "trainer_npus": 2, "rollout_npus": 3, "name": "a; rm -rf /"}
    plan = api.post("/runs", params={"dry_run": True}, json=spec).json()
    groups = {g["role"]: g for g in plan["shape"]["groups"]}
    assert groups["trainer"]["accelerators"] == 2 and groups["rollout"]["accelerators"] == 3
    assert all(g["cpus"] <= 0.5 for g in groups.values())
    assert plan["command"][:3] == ["python3", "-m", "jobs.tiny_grpo"]
    assert plan["command"][plan["command"].index("--trainer-npus") + 1] == "2"
    assert plan["total_steps"] == 30
    assert any("not a stand-in for verl" in w for w in plan["warnings"])


def test_bad_tiny_grpo_fields_are_422_with_their_path(api: TestClient) -> None:
    resp = api.post("/runs", json={"recipe": "tiny-grpo", "rs_threshold": "1.2_2.0"})
    assert resp.status_code == 422
    assert "rs_threshold must bracket 1.0" in resp.text
    resp = api.post("/runs", json={"recipe": "tiny-grpo", "n": 1})
    assert resp.status_code == 422 and resp.json()["errors"][0]["field"] == "n"


def test_rewards_follow_geo3k_shape_and_advantages_are_group_relative() -> None:
    fmt = np.array([1, 1, 0, 1])
    answer = np.array([3, 4, 3, 3])
    assert score(fmt, answer, np.array([3, 3, 3, 3])).tolist() == [1.0, 0.1, 0.0, 1.0]
    adv = group_advantages(np.array([1.0, 0.0, 0.5, 0.5]), 2)
    assert np.allclose(adv, [1.0, -1.0, 0.0, 0.0], atol=1e-5)


def test_samples_far_from_the_current_policy_are_rejected_and_weights_truncated() -> None:
    weights = Weights.zeros(1)
    prompt = np.zeros(4, dtype=np.int64)
    fmt = np.array([1, 1, 0, 0])
    answer = np.array([0, 1, 2, 3])
    current = weights.token_logps(prompt, fmt, answer)
    behaviour = current.copy()
    behaviour[0] -= 5.0  # far less likely under the behaviour policy: ratio e^10, rejected
    batch = Batch(0, prompt, fmt, answer, np.array([1.0, 0.0, 0.1, 0.0]), behaviour, 4)
    stats = update(weights, batch, 1.0, Correction(is_threshold=2.0, rs_lower=0.5, rs_upper=2.0))
    assert stats["actor/rollout_corr/rollout_rs_masked_fraction"] == 0.25
    assert stats["actor/rollout_corr/rollout_is_mean"] == (2.0 + 1 + 1 + 1) / 4


def test_its_console_lines_are_verl_lines_the_parser_reads() -> None:
    line = console_line(3, {"critic/score/mean": 0.5, "val-core/x/acc/mean@1": np.float64(1.0)})
    assert line == "step:3 - critic/score/mean:0.5 - val-core/x/acc/mean@1:np.float64(1.0)"
    parsed = parse_line(f"(TinyGrpoTrainer pid=1) {line}")
    assert parsed is not None and parsed.values["val-core/x/acc/mean@1"] == 1.0


def test_its_training_line_names_each_timing_once(capsys: pytest.CaptureFixture[str]) -> None:
    trainer = TinyGrpoTrainer(4, 0, 1.0, Correction(2.0, 0.5, 2.0), train_s=0.0)
    rollouter = TinyGrpoRollouter(4, 2, 4, 0, gen_s=0.0)
    trainer.train(rollouter.generate(), waited_s=0.0)
    trainer.log_sync(1, 0, 0.25)
    parsed = parse_line(capsys.readouterr().out.strip())
    assert parsed is not None and parsed.values["timing_s/param_sync"] == 0.25
    assert not [k for k in parsed.values if k.startswith("timing_s/timing_s")]
