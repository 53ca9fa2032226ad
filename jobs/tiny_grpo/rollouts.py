"""A trainer step's samples, as verl's ``trainer.rollout_data_dir`` holds them.

One file a trainer step, ``<dir>/<step>.jsonl``: a JSON object a line with ``input`` (the prompt
as text), ``output`` (the response as text), ``gts`` (the right answer), ``score``, ``step`` and
the reward's extra field ``acc`` (the answer was boxed and right), as verl's
``_write_generations`` writes them. A file is written under another name and renamed, so the
sample shipper (``jobs.samples``) never reads one half written.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from jobs.tiny_grpo.policy import Batch


def prompt_text(a: int, b: int) -> str:
    return f"What is ({a} + {b}) mod 10? Put the final answer in \\boxed{{}}."


def response_text(fmt: int, answer: int) -> str:
    """The two tokens read out: the answer digit, boxed when the format token says so."""
    return f"The answer is \\boxed{{{answer}}}." if fmt == 1 else f"The answer is {answer}."


def write_step(
    directory: str, step: int, batch: Batch, prompts: NDArray[np.int64], expected: NDArray[np.int64]
) -> Path:
    """Write ``batch`` as trainer step ``step``'s file in ``directory``; its path."""
    os.makedirs(directory, exist_ok=True)
    lines = []
    for p, fmt, answer, score in zip(
        batch.prompt.tolist(), batch.fmt.tolist(), batch.answer.tolist(), batch.reward.tolist(),
        strict=True,
    ):  # fmt: skip
        a, b = prompts[p].tolist()
        row = {"input": prompt_text(a, b), "output": response_text(fmt, answer),
               "gts": str(expected[p]), "score": score, "step": step,
               "acc": bool(fmt == 1 and answer == expected[p])}  # fmt: skip
        lines.append(json.dumps(row, ensure_ascii=False) + "\n")
    final = Path(directory) / f"{step}.jsonl"
    partial = Path(directory) / f".{step}.jsonl.writing"
    partial.write_text("".join(lines), encoding="utf-8")
    os.replace(partial, final)
    return final
