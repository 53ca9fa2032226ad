"""A periodic loop that runs a blocking ``tick`` off the event loop, backing off on failure.

Each loop has its own thread: requests and event streams never leave it without one, and it
never takes one of theirs. A wake runs the next tick early, but never sooner after a tick than
that tick took: a flood of wakes (each accepted run wakes the submitter) gets at most half of
the interpreter for the loop, and the requests keep the rest.
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
            took = time.perf_counter() - started
            if self.on_tick is not None:
                self.on_tick(took)
            delay = Backoff(self.interval_s, self.max_backoff_s).delay(self.failures)
            if await _stopped(stop, delay, self._wake):
                return
            rested = time.perf_counter() - started - took
            if rested < took:  # woken early: the tick just run gets its own length of rest
                await _stopped(stop, took - rested)


async def _stopped(stop: asyncio.Event, timeout: float, wake: asyncio.Event | None = None) -> bool:
    """Wait ``timeout`` seconds, or until ``wake`` is set; whether ``stop`` was set instead."""
    waiters = {asyncio.ensure_future(stop.wait())}
    if wake is not None:
        waiters.add(asyncio.ensure_future(wake.wait()))
    try:
        await asyncio.wait(waiters, timeout=timeout, return_when="FIRST_COMPLETED")
    finally:  # the waiters not woken end here, also when this loop is cancelled
        for fut in waiters:
            fut.cancel()
        await asyncio.gather(*waiters, return_exceptions=True)
    return stop.is_set()
