"""Per-caller limits kept in this replica's memory: what each token holds at once (live event
streams, spec validations in progress)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from service.errors import TooManyRequests


class CallerSlots:
    """Counts what each caller holds of one kind; ``take`` refuses one over ``limit``."""

    def __init__(self, what: str, retry_after_s: int) -> None:
        self.what = what
        self.retry_after_s = retry_after_s
        self.open: dict[str, int] = {}
        self._lock = threading.Lock()

    def take(self, key: str, limit: int) -> None:
        with self._lock:
            if self.open.get(key, 0) >= limit:
                raise TooManyRequests(
                    f"at most {limit} {self.what} per token", retry_after_s=self.retry_after_s
                )
            self.open[key] = self.open.get(key, 0) + 1

    def give(self, key: str) -> None:
        with self._lock:
            self.open[key] -= 1
            if not self.open[key]:
                del self.open[key]

    @contextmanager
    def held(self, key: str, limit: int) -> Iterator[None]:
        self.take(key, limit)
        try:
            yield
        finally:
            self.give(key)


class StreamSlots(CallerSlots):
    def __init__(self) -> None:
        super().__init__("live event streams", retry_after_s=5)


class ValidationSlots(CallerSlots):
    """Specs being validated at once (dry runs and submissions: a verl spec may need a full
    Hydra composition, which runs one at a time in the process)."""

    def __init__(self) -> None:
        super().__init__("specs validated at once", retry_after_s=1)
