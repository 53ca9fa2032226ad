"""Per-caller limits kept in this replica's memory: live event streams per token."""

from __future__ import annotations

import threading

from service.errors import TooManyRequests


class StreamSlots:
    """Counts the open event streams of each caller; ``take`` refuses one over ``limit``."""

    def __init__(self) -> None:
        self.open: dict[str, int] = {}
        self._lock = threading.Lock()

    def take(self, key: str, limit: int) -> None:
        with self._lock:
            if self.open.get(key, 0) >= limit:
                raise TooManyRequests(
                    f"at most {limit} live event streams per token", retry_after_s=5
                )
            self.open[key] = self.open.get(key, 0) + 1

    def give(self, key: str) -> None:
        with self._lock:
            self.open[key] -= 1
            if not self.open[key]:
                del self.open[key]
