"""A periodic loop that runs a blocking ``tick`` off the event loop, backing off on failure.

Each loop has its own thread: requests and event streams never leave it without one, and it
never takes one of theirs.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from service.backoff import Backoff
from service.cluster.ray_jobs import RayUnavailable
from service.errors import DatabaseBusy

log = logging.getLogger(__name__)


@dataclass
class Loop:
    name: str
    tick: Callable[[], None]
    interval_s: float
    max_backoff_s: float
    # Called once the loop has stopped (off the event loop): what its ticks kept open.
    close: Callable[[], None] | None = None
    failures: int = field(default=0, init=False)  # in a row; the backoff grows with them
    ticks: int = field(default=0, init=False)  # ticks run to the end, failed or not
    on_tick: Callable[[float], None] | None = field(default=None, init=False)  # its seconds
    _wake: asyncio.Event = field(default_factory=asyncio.Event, init=False)
    _loop: asyncio.AbstractEventLoop | None = field(default=None, init=False)

    def wake(self) -> None:
        """Run the next tick now; safe to call from any thread."""
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._wake.set)

    async def run(self, stop: asyncio.Event) -> None:
        self._loop = asyncio.get_running_loop()
        thread = ThreadPoolExecutor(1, thread_name_prefix=f"loop-{self.name}")
        try:
            await self._run(stop, thread)
        finally:
            thread.shutdown(wait=False)
            if self.close is not None:
                await asyncio.to_thread(self.close)

    async def _run(self, stop: asyncio.Event, thread: ThreadPoolExecutor) -> None:
        assert self._loop is not None
        while not stop.is_set():
            self._wake.clear()
            started = time.perf_counter()
            try:
                await self._loop.run_in_executor(thread, self.tick)
                self.failures = 0
            except RayUnavailable as exc:
                self.failures += 1
                log.warning("%s: Ray unavailable (%s); backing off", self.name, exc)
            except DatabaseBusy as exc:
                self.failures += 1
                log.warning("%s: %s; backing off", self.name, exc.detail)
            except Exception:
                self.failures += 1
                log.exception("%s: tick failed", self.name)
            self.ticks += 1
            if self.on_tick is not None:
                self.on_tick(time.perf_counter() - started)
            delay = Backoff(self.interval_s, self.max_backoff_s).delay(self.failures)
            waiters = {asyncio.ensure_future(stop.wait()), asyncio.ensure_future(self._wake.wait())}
            try:
                await asyncio.wait(waiters, timeout=delay, return_when="FIRST_COMPLETED")
            finally:  # the waiter not woken ends here, also when this loop is cancelled
                for fut in waiters:
                    fut.cancel()
                await asyncio.gather(*waiters, return_exceptions=True)
