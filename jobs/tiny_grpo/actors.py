"""The rollout group and the trainer group, each a Ray actor holding its virtual NPUs.

Metric lines are printed the way verl's console logger prints them (``step:N - key:value``,
``step`` = parameter version, numpy values as their repr), so Ray prefixes them with the actor
name exactly as it does verl's ``FullyAsyncTrainer`` lines.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np

from jobs.tiny_grpo import rollouts
from jobs.tiny_grpo.policy import Batch, Correction, Weights, greedy_accuracy, sample, update
from jobs.tiny_grpo.task import make_prompts, score, truth


def console_line(step: int, values: dict[str, Any]) -> str:
    """verl's console format: ``step:N - key:repr(value) - ...``."""
    return " - ".join([f"step:{step}", *(f"{k}:{v!r}" for k, v in values.items())])


class TinyGrpoRollouter:
    """Generates ``n`` responses per prompt with the newest weights it has been sent."""

    def __init__(self, prompts: int, batch_prompts: int, n: int, seed: int, gen_s: float) -> None:
        self.prompts = make_prompts(prompts, seed)
        self.expected = truth(self.prompts)
        self.batch_prompts = batch_prompts
        self.n = n
        self.gen_s = gen_s
        self.rng = np.random.default_rng(seed + 1)
        self.weights = Weights.zeros(prompts)
        self.version = 0
        self.cursor = 0
        self.active_s = 0.0
        self.since = time.monotonic()
        self.generated = 0
        self.lock = threading.Lock()

    def generate(self) -> Batch:
        # Generation calls run one at a time; ``set_weights`` may arrive during one.
        with self.lock:
            return self._generate()

    def _generate(self) -> Batch:
        started = time.monotonic()
        idx = (self.cursor + np.arange(self.batch_prompts)) % len(self.prompts)
        self.cursor += self.batch_prompts
        prompt, fmt, answer, logp = sample(self.weights, idx.astype(np.int64), self.n, self.rng)
        time.sleep(self.gen_s)  # stands in for generation time
        self.generated += len(prompt)
        self.active_s += time.monotonic() - started
        reward = score(fmt, answer, self.expected[prompt])
        return Batch(self.version, prompt, fmt, answer, reward, logp, self.n)

    def epoch(self) -> int:
        return self.cursor // len(self.prompts)

    def restore(self, weights: Weights, version: int, cursor: int) -> None:
        """Continue from a checkpoint: its weights, version and place in the dataset."""
        # Ray hands numpy arrays over read-only (zero copy): keep a copy of our own.
        self.weights, self.version, self.cursor = weights.copy(), version, cursor

    def set_weights(self, weights: Weights, version: int) -> None:
        now = time.monotonic()
        span = max(now - self.since, 1e-9)
        values = {
            "fully_async/rollouter/active_time": self.active_s,
            "fully_async/rollouter/version_time": span,
            "fully_async/rollouter/idle_ratio": max(0.0, 1.0 - self.active_s / span),
            "fully_async/rollouter/step_generated_samples": self.generated,
        }
        print(console_line(version, values), flush=True)
        self.weights, self.version = weights, version
        self.active_s, self.since, self.generated = 0.0, now, 0


class TinyGrpoTrainer:
    """Trains on batches as they arrive; aggregates metrics between parameter syncs. With a
    ``samples_dir``, each trainer step's samples are written there as verl writes them."""

    def __init__(
        self,
        prompts: int,
        seed: int,
        lr: float,
        corr: Correction,
        train_s: float,
        samples_dir: str = "",
    ) -> None:
        self.weights = Weights.zeros(prompts)
        self.prompts = make_prompts(prompts, seed)
        self.expected = truth(self.prompts)
        self.samples_dir = samples_dir
        self.lr = lr
        self.corr = corr
        self.train_s = train_s
        self.version = 0
        self.global_step = 0
        self.stale = 0
        self.pending: list[dict[str, float]] = []
        self.waited_s = 0.0
        self.since = time.monotonic()

    def train(self, batch: Batch, waited_s: float) -> float:
        started = time.monotonic()
        stats = update(self.weights, batch, self.lr, self.corr)
        time.sleep(self.train_s)  # stands in for the update's compute
        self.global_step += 1
        if self.samples_dir:
            rollouts.write_step(
                self.samples_dir, self.global_step, batch, self.prompts, self.expected
            )
        if batch.version < self.version:
            self.stale += len(batch.reward)
        stats |= {
            "critic/score/mean": float(batch.reward.mean()),
            "critic/score/max": float(batch.reward.max()),
            "critic/score/min": float(batch.reward.min()),
            "timing_s/step": time.monotonic() - started + waited_s,
            "staleness": float(self.version - batch.version),
        }
        self.pending.append(stats)
        self.waited_s += waited_s
        return float(batch.reward.mean())

    def weights_for_sync(self) -> Weights:
        return self.weights.copy()

    def checkpoint_state(self) -> tuple[Weights, int]:
        """What a checkpoint keeps of the trainer: its weights and global step."""
        return self.weights.copy(), self.global_step

    def restore(self, weights: Weights, version: int, global_step: int) -> None:
        self.weights, self.version, self.global_step = weights.copy(), version, global_step

    def validate(self, step: int) -> float:
        acc = greedy_accuracy(self.weights, self.expected)
        values = {
            "val-core/tiny/arith/acc/mean@1": np.float64(acc),
            "val-aux/tiny/arith/reward/mean@1": np.float64(acc),
            "val-aux/num_turns/mean": np.int64(1),
        }
        print(console_line(step, values), flush=True)
        return acc

    def log_sync(self, version: int, epoch: int, sync_s: float) -> None:
        """The aggregated training line for one parameter version, as verl prints it."""
        self.version = version
        mean = {k: float(np.mean([s[k] for s in self.pending])) for k in self.pending[0]}
        span = max(time.monotonic() - self.since, 1e-9)
        staleness = mean.pop("staleness")
        values: dict[str, Any] = {
            "training/global_step": self.global_step,
            "training/epoch": epoch,
            "critic/score/mean": mean["critic/score/mean"],
            "critic/score/max": max(s["critic/score/max"] for s in self.pending),
            "critic/score/min": min(s["critic/score/min"] for s in self.pending),
            "critic/rewards/mean": mean["critic/score/mean"],
            "critic/rewards/max": max(s["critic/score/max"] for s in self.pending),
            "critic/rewards/min": min(s["critic/score/min"] for s in self.pending),
            **{k: v for k, v in mean.items() if not k.startswith("critic/score")},
            "response_length/mean": 2.0,
            "actor/lr": self.lr,
            "timing_s/param_sync": sync_s,
            "fully_async/count/stale_trajectory_processed": self.stale,
            "fully_async/count/current_param_version": version,
            "fully_async/count/mean_staleness": staleness,
            "fully_async/partial/partial_ratio": 0.0,
            "fully_async/trainer/idle_ratio": min(1.0, self.waited_s / span),
        }
        print(console_line(version, values), flush=True)
        self.pending, self.waited_s, self.since = [], 0.0, time.monotonic()
