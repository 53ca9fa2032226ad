"""The toy verifiable task: "(a + b) mod 10", scored like geo3k (0.9 x correct + 0.1 x format).

A response is two tokens: a format token (1 = answer boxed, 0 = not) and an answer digit. As with
geo3k's boxed-answer extraction, an unboxed answer cannot be checked, so it never counts as
correct; scores are therefore in {0, 0.1, 1.0}.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

ANSWERS = 10
FORMATS = 2


def make_prompts(count: int, seed: int) -> NDArray[np.int64]:
    """``count`` prompts as rows ``(a, b)``."""
    rng = np.random.default_rng(seed)
    return rng.integers(0, 10, size=(count, 2), dtype=np.int64)


def truth(prompts: NDArray[np.int64]) -> NDArray[np.int64]:
    return np.asarray((prompts[:, 0] + prompts[:, 1]) % ANSWERS, dtype=np.int64)


def score(
    fmt: NDArray[np.int64], answer: NDArray[np.int64], expected: NDArray[np.int64]
) -> NDArray[np.float64]:
    boxed = fmt == 1
    correct = boxed & (answer == expected)
    return np.asarray(0.9 * correct + 0.1 * boxed, dtype=np.float64)
