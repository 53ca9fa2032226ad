"""Load shedding: past ``limit`` requests waiting for their answer, a request is answered 503
at once.

Requests wait for a worker thread in arrival order; under a flood that queue, and so every
answer's wait, would grow without bound. Counting the requests not yet answered (until their
response starts: a live event stream counts until its headers are sent) and refusing the excess
at the door (503 problem+json with ``Retry-After``) keeps the wait of the admitted ones short.
``/healthz`` is never refused.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.api.problems import problem_response
from service.errors import Overloaded


class ShedLoad:
    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit
        self.in_progress = 0

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

        async def answered(message: Message) -> None:
            nonlocal waiting
            if waiting and message["type"] == "http.response.start":
                waiting = False
                self.in_progress -= 1
            await send(message)

        try:
            await self.app(scope, receive, answered)
        finally:
            if waiting:
                self.in_progress -= 1
