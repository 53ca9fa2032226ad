"""A shutdown signal seen by the app before the server's own handler."""

from __future__ import annotations

import asyncio
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType


@contextmanager
def on_shutdown_signal(callback: Callable[[], None]) -> Iterator[None]:
    """Run ``callback`` on the event loop as soon as SIGTERM or SIGINT arrives, then the
    server's own handler (uvicorn's starts its graceful shutdown, which waits for open
    responses: live event streams must end first). Only in the main thread, where signals are."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    loop = asyncio.get_running_loop()
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}

    def handler(sig: int, frame: FrameType | None) -> None:
        loop.call_soon_threadsafe(callback)
        before = previous[signal.Signals(sig)]
        if callable(before):
            before(sig, frame)
        elif before == signal.SIG_DFL:
            signal.signal(sig, signal.SIG_DFL)
            signal.raise_signal(sig)

    for sig in previous:
        signal.signal(sig, handler)
    try:
        yield
    finally:
        for sig, before in previous.items():
            signal.signal(sig, before)
