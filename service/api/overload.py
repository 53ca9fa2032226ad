"""Load shedding: a request is answered 503 at once past ``limit`` requests in progress, and
after ``wait_s`` if it has not got in by then.

Requests go into the app through a gate, in arrival order, each waiting ``wait_s`` at most:
one that has not got in by then is answered 503 instead of late. How many are in at a time
adapts (additive increase, multiplicative decrease, as TCP's window): at most ``inside``
(twice the worker threads: one running while the next is parsed), a quarter of that at first,
more while the event loop keeps time and answers come within ``wait_s / 4``, fewer when the
loop lags by more than ``LAG_S`` or an answer is slower. Worker threads queue with the event
loop's thread for one interpreter: with 64 requests in, on a CPU that other work shares, the
loop took seconds to accept a connection, read a request or write an answer (500 clients: a
tail of 9-15 s, ``/healthz`` on the API's port 4.6 s at p99); fewer in keeps the loop turning
and an admitted request's answer bounded, and the rest are refused promptly. Counting the
requests not yet answered (until their response starts: a live event stream counts until its
headers are sent) and refusing those past ``limit`` keeps the queue itself short. Refusals are
problem+json with ``Retry-After``. ``/healthz`` is never refused.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.api.problems import problem_response
from service.errors import Overloaded

# How often the gate looks at the event loop, and the lag (smoothed) past which fewer are let in.
TICK_S = 0.05
LAG_S = 0.02


def first_limit(most: int) -> float:
    """A slow start, as TCP's: a quarter of the most."""
    return float(max(min(most, 2), most // 4))


class Gate:
    """Arrival-order admission with a limit that follows how promptly the event loop turns
    and requests are answered (one event loop's)."""

    def __init__(self, most: int, slow_s: float) -> None:
        self.most = most
        self.least = min(most, max(2, most // 16))
        self.slow_s = slow_s
        self.limit = first_limit(most)
        self.inside = 0
        self.lag_s = 0.0
        self._waiting: deque[asyncio.Future[None]] = deque()
        self._cut_at = 0.0
        loop = asyncio.get_running_loop()
        loop.call_later(TICK_S, self._tick, loop, loop.time() + TICK_S)

    def _tick(self, loop: asyncio.AbstractEventLoop, due: float) -> None:
        """The loop's lag, smoothed: threads that take the interpreter from the loop thread
        delay every timer, and every connection accepted, request read and answer written."""
        now = loop.time()
        self.lag_s += 0.2 * (now - due - self.lag_s)
        if self.lag_s > LAG_S:
            self._cut()
        loop.call_later(TICK_S, self._tick, loop, now + TICK_S)

    def _cut(self) -> None:
        # Once per slow_s: what happens meanwhile was let in under the old limit.
        now = time.monotonic()
        if now - self._cut_at > self.slow_s:
            self.limit = max(self.least, self.limit * 0.75)
            self._cut_at = now

    async def enter(self, wait_s: float) -> bool:
        """In within ``wait_s`` (True), or not (False: the caller holds no place)."""
        if self.inside < int(self.limit) and not self._waiting:
            self.inside += 1
            return True
        handed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.append(handed)
        try:
            await asyncio.wait_for(asyncio.shield(handed), wait_s)
            return True
        except TimeoutError:
            self._give_back(handed)
            return False
        except asyncio.CancelledError:  # the client went away while it waited
            self._give_back(handed)
            raise

    def _give_back(self, handed: asyncio.Future[None]) -> None:
        if handed.done():  # handed a place as the wait ended: it goes to the next in line
            self._hand_on(self.inside - 1)
        else:
            handed.cancel()

    def leave(self, took_s: float) -> None:
        """A request is out after ``took_s`` inside: its place goes to the next in line."""
        if took_s > self.slow_s:
            self._cut()
        elif self.lag_s < LAG_S / 2:
            self.limit = min(self.most, self.limit + 1 / self.limit)
        self._hand_on(self.inside - 1)

    def _hand_on(self, inside: int) -> None:
        self.inside = inside
        while self._waiting and self.inside < int(self.limit):
            handed = self._waiting.popleft()
            if not handed.done():
                handed.set_result(None)
                self.inside += 1


class ShedLoad:
    def __init__(
        self,
        app: ASGIApp,
        limit: int,
        inside: int,
        wait_s: float,
        watch: Callable[[Callable[[], tuple[float, int, float]]], None],
    ) -> None:
        self.app = app
        self.limit = limit
        self.most_inside = inside
        self.wait_s = wait_s
        self.in_progress = 0
        self._gate: tuple[asyncio.AbstractEventLoop, Gate] | None = None
        watch(self.state)  # read at scrape time (service.telemetry)

    def state(self) -> tuple[float, int, float]:
        """How many the door lets in now, how many are in, and the loop's smoothed lag."""
        if self._gate is None:
            return first_limit(self.most_inside), 0, 0.0
        gate = self._gate[1]
        return float(int(gate.limit)), gate.inside, gate.lag_s

    def gate(self) -> Gate:
        """The gate of the running event loop (an app may be served by one loop, then another)."""
        loop = asyncio.get_running_loop()
        if self._gate is None or self._gate[0] is not loop:
            self._gate = (loop, Gate(self.most_inside, self.wait_s / 4))
        return self._gate[1]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or path == "/healthz":
            await self.app(scope, receive, send)
            return
        if self.in_progress >= self.limit:
            error = Overloaded(f"more than {self.limit} requests waiting; retry shortly")
            await problem_response(error, path)(scope, receive, send)
            return
        self.in_progress += 1
        waiting = True
        gate = self.gate()
        entered: float | None = None

        def out() -> None:
            nonlocal entered
            if entered is not None:
                gate.leave(time.monotonic() - entered)
                entered = None

        async def answered(message: Message) -> None:
            nonlocal waiting
            if waiting and message["type"] == "http.response.start":
                waiting = False
                self.in_progress -= 1
                out()  # a live stream holds no place inside once its headers are out
            await send(message)

        try:
            if not await gate.enter(self.wait_s):
                now = f"{int(gate.limit)} of {gate.most} in at a time now"
                error = Overloaded(f"not started within {self.wait_s:g} s ({now}); retry shortly")
                await problem_response(error, path)(scope, receive, answered)
                return
            entered = time.monotonic()
            await self.app(scope, receive, answered)
        finally:
            out()
            if waiting:
                self.in_progress -= 1
