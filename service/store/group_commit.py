"""Group commit: writes of one kind that arrive while another is being committed are committed
together, in the next transaction, by one of the threads that made them.

The first thread in *leads*: it writes its own item at once. Items that come while it writes
wait in arrival order; when it is done it hands the lead to the first of them, which writes all
that waited (up to ``max_batch``) in one transaction, and so on. A write never waits for a
timer, and a thread waits only for one that is already writing (never for a thread that has yet
to be scheduled), so nothing here can wait on itself. ``write_all`` answers each item on its
own: a result or the error that item alone met.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")


@dataclass(eq=False)
class _Waiter(Generic[T, R]):
    item: T
    woken: threading.Event = field(default_factory=threading.Event)
    lead: bool = False
    result: R | None = None
    error: BaseException | None = None


class GroupCommit(Generic[T, R]):
    def __init__(
        self, write_all: Callable[[Sequence[T]], list[R | BaseException]], max_batch: int = 64
    ) -> None:
        self._write_all = write_all
        self.max_batch = max_batch
        self._lock = threading.Lock()
        self._waiting: deque[_Waiter[T, R]] = deque()
        self._leading = False
        self.batches = 0  # transactions written, for tests and benchmarks
        self.items = 0

    def write(self, item: T) -> R:
        """``item`` written and committed (alone or with others); its result, or its error."""
        me: _Waiter[T, R] = _Waiter(item)
        with self._lock:
            self._waiting.append(me)
            if not self._leading:
                self._leading = me.lead = True
        if not me.lead:
            me.woken.wait()  # for a result, or for the lead
        if me.lead:
            self._lead()
        if me.error is not None:
            raise me.error
        return me.result  # type: ignore[return-value]  # set with no error: an R

    def _lead(self) -> None:
        """Write the next batch (the leader's own item first in it), then hand the lead on."""
        with self._lock:
            size = min(self.max_batch, len(self._waiting))
            batch = [self._waiting.popleft() for _ in range(size)]
        try:
            answers = self._write_all([w.item for w in batch])
        except BaseException as exc:  # write_all answers per item; this is its own failure
            answers = [exc] * len(batch)
        with self._lock:
            self.batches += 1
            self.items += len(batch)
            following = self._waiting[0] if self._waiting else None
            if following is None:
                self._leading = False
            else:
                following.lead = True
        for waiter, answer in zip(batch, answers, strict=True):
            if isinstance(answer, BaseException):
                waiter.error = answer
            else:
                waiter.result = answer
            waiter.lead = False
            waiter.woken.set()
        if following is not None:
            following.woken.set()
