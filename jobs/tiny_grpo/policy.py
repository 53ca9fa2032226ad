"""The policy (a table of logits) and one GRPO update with rollout correction, in numpy.

Rollout correction follows verl's sequence-level options: importance weights are the sequence
ratio current/behaviour, truncated at ``is_threshold``; rejection sampling drops a sequence whose
geometric-mean token ratio (``seq_mean_k1``) falls outside ``[rs_lower, rs_upper]``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from jobs.tiny_grpo.task import ANSWERS, FORMATS

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]


def log_softmax(logits: FloatArray) -> FloatArray:
    shifted = logits - logits.max(axis=-1, keepdims=True)
    return np.asarray(shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True)))


@dataclass
class Weights:
    fmt: FloatArray  # (FORMATS,): shared by every prompt
    answer: FloatArray  # (prompts, ANSWERS)

    @classmethod
    def zeros(cls, prompts: int) -> Weights:
        return cls(np.zeros(FORMATS), np.zeros((prompts, ANSWERS)))

    def copy(self) -> Weights:
        return Weights(self.fmt.copy(), self.answer.copy())

    def token_logps(self, prompt: IntArray, fmt: IntArray, answer: IntArray) -> FloatArray:
        """(samples, 2): log-probs of the format token and the answer token."""
        lp_fmt = log_softmax(self.fmt)[fmt]
        lp_ans = log_softmax(self.answer[prompt])[np.arange(len(prompt)), answer]
        return np.stack([lp_fmt, lp_ans], axis=1)


@dataclass
class Batch:
    """``n`` responses for each prompt, with the behaviour policy's token log-probs."""

    version: int
    prompt: IntArray  # (samples,) prompt index, grouped: n consecutive samples per prompt
    fmt: IntArray
    answer: IntArray
    reward: FloatArray
    behaviour_logp: FloatArray  # (samples, 2)
    n: int


def sample(
    weights: Weights, prompts: IntArray, n: int, rng: np.random.Generator
) -> tuple[IntArray, IntArray, IntArray, FloatArray]:
    prompt = np.repeat(prompts, n)
    p_fmt = np.exp(log_softmax(weights.fmt))
    p_ans = np.exp(log_softmax(weights.answer[prompt]))
    fmt = rng.choice(FORMATS, size=len(prompt), p=p_fmt).astype(np.int64)
    cum = p_ans.cumsum(axis=1)
    answer = (rng.random((len(prompt), 1)) > cum).sum(axis=1).clip(0, ANSWERS - 1)
    answer = answer.astype(np.int64)
    return prompt, fmt, answer, weights.token_logps(prompt, fmt, answer)


def group_advantages(reward: FloatArray, n: int) -> FloatArray:
    """GRPO: each response's reward against its prompt group's mean, over the group's std."""
    groups = reward.reshape(-1, n)
    std = groups.std(axis=1, keepdims=True)
    adv = (groups - groups.mean(axis=1, keepdims=True)) / (std + 1e-6)
    return np.asarray(np.where(std > 0, adv, 0.0).reshape(-1))


@dataclass
class Correction:
    is_threshold: float = 2.0
    rs_lower: float = 0.5
    rs_upper: float = 2.0


def update(weights: Weights, batch: Batch, lr: float, corr: Correction) -> dict[str, float]:
    """One policy-gradient step on ``batch`` (in place); returns the step's metrics."""
    current = weights.token_logps(batch.prompt, batch.fmt, batch.answer)
    log_ratio = current - batch.behaviour_logp
    seq_ratio = np.exp(log_ratio.sum(axis=1))
    is_weight = np.minimum(seq_ratio, corr.is_threshold)
    geo_ratio = np.exp(log_ratio.mean(axis=1))
    kept = (geo_ratio >= corr.rs_lower) & (geo_ratio <= corr.rs_upper)
    adv = group_advantages(batch.reward, batch.n)
    coef = np.where(kept, is_weight * adv, 0.0) / batch.n

    p_fmt = np.exp(log_softmax(weights.fmt))
    g_fmt = (coef[:, None] * (np.eye(len(p_fmt))[batch.fmt] - p_fmt)).sum(axis=0)
    p_ans = np.exp(log_softmax(weights.answer[batch.prompt]))
    rows = coef[:, None] * (np.eye(p_ans.shape[1])[batch.answer] - p_ans)
    g_ans = np.zeros_like(weights.answer)
    np.add.at(g_ans, batch.prompt, rows)
    groups = len(batch.prompt) // batch.n
    weights.fmt += lr * g_fmt / groups
    weights.answer += lr * g_ans
    return {
        "actor/pg_loss": float(-(coef * current.sum(axis=1)).sum() / groups),
        "actor/grad_norm": float(np.sqrt((g_fmt**2).sum() / groups**2 + (g_ans**2).sum())),
        "actor/rollout_corr/rollout_is_mean": float(is_weight.mean()),
        "actor/rollout_corr/rollout_rs_masked_fraction": float(1.0 - kept.mean()),
        "critic/advantages/mean": float(adv.mean()),
        "critic/advantages/max": float(adv.max()),
        "critic/advantages/min": float(adv.min()),
    }


def greedy_accuracy(weights: Weights, expected: IntArray) -> float:
    boxed = bool(np.argmax(weights.fmt) == 1)
    hits = float((np.argmax(weights.answer, axis=1) == expected).mean())
    return hits if boxed else 0.0
