"""Load shedding: a request is answered 503 at once past ``limit`` requests in progress, and
after ``wait_s`` if it has not got in by then.

At most ``inside`` requests are in the app at a time (twice the worker threads: one running
while the next is parsed). The others wait here, in arrival order, each for ``wait_s`` at most:
one that has not got in by then is answered 503 instead of late, so an admitted request's
answer is bounded on any machine, also while the interpreter stalls (a long round of a loop,
garbage collection). Counting the requests not yet answered (until their response starts: a
live event stream counts until its headers are sent) and refusing those past ``limit`` keeps
the queue itself short. Refusals are problem+json with ``Retry-After``. ``/healthz`` is never
refused.
"""

from __future__ import annotations

import asyncio

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.api.problems import problem_response
from service.errors import Overloaded


class ShedLoad:
    def __init__(self, app: ASGIApp, limit: int, inside: int, wait_s: float) -> None:
        self.app = app
        self.limit = limit
        self.inside = inside
        self.wait_s = wait_s
        self.in_progress = 0
        self._gate: tuple[asyncio.AbstractEventLoop, asyncio.Semaphore] | None = None

    def _semaphore(self) -> asyncio.Semaphore:
        """The gate of the running event loop (an app may be served by one loop, then another)."""
        loop = asyncio.get_running_loop()
        if self._gate is None or self._gate[0] is not loop:
            self._gate = (loop, asyncio.Semaphore(self.inside))
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
        gate = self._semaphore()
        inside = False

        async def answered(message: Message) -> None:
            nonlocal waiting, inside
            if waiting and message["type"] == "http.response.start":
                waiting = False
                self.in_progress -= 1
                if inside:  # a live stream holds no place inside once its headers are out
                    inside = False
                    gate.release()
            await send(message)

        try:
            try:
                if gate.locked():  # else a place is free: taken at once, no timer needed
                    await asyncio.wait_for(gate.acquire(), self.wait_s)
                else:
                    await gate.acquire()
            except TimeoutError:
                error = Overloaded(f"not started within {self.wait_s:g} s; retry shortly")
                await problem_response(error, path)(scope, receive, answered)
                return
            inside = True
            await self.app(scope, receive, answered)
        finally:
            if inside:
                gate.release()
            if waiting:
                self.in_progress -= 1
