"""Exponential backoff, the one rule every retry of the service and its client follows: after
``failures`` failures in a row, wait ``base_s * 2**failures``, at most ``cap_s``."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Backoff:
    base_s: float
    cap_s: float

    def delay(self, failures: int) -> float:
        """Seconds to wait before the next try; ``base_s`` while nothing has failed."""
        if failures <= 0:
            return self.base_s
        return min(self.base_s * float(2 ** min(failures, 30)), self.cap_s)
