"""A job's log as Ray streams it (``/api/jobs/{id}/logs/tail``), from a character offset.

One thread per followed run keeps the websocket open and buffers what arrives; the follower
takes the buffer each tick, so a read costs what the new text costs, however long the log is.
Ray's tail replays the log from its start on every connection: the text already received is
skipped once per (re)connection. Ray closes the stream normally once the job has ended and its
log has been sent to the end; a normal close seen after the run was known to have ended is
therefore the end of the log. The buffer is bounded: when the follower falls behind, the
thread stops reading and the socket holds Ray back.
"""

from __future__ import annotations

import logging
import threading
from datetime import datetime

from websockets.exceptions import ConnectionClosedOK, InvalidStatus, WebSocketException
from websockets.sync.client import ClientConnection, connect

from service.store.models import utcnow

log = logging.getLogger(__name__)
# How long a keepalive ping may go unanswered before the connection counts as broken.
PING_TIMEOUT_S = 60.0
# How long closing waits for Ray's side of the close: Ray's tail never reads its socket while
# the job runs, so it never answers, and each close would wait websockets' 10 s (the follower's
# thread waited so for every tail it let go, at a handover or at shutdown).
CLOSE_TIMEOUT_S = 0.5
# The connection's own log: a broken one is reported below, once, not as websockets' traceback
# from its keepalive thread (on a saturated machine, or when Ray's head stops under live tails).
_ws_log = logging.getLogger(f"{__name__}.websocket")
_ws_log.setLevel(logging.CRITICAL)


class LogTail:
    RECONNECT_S = 1.0
    AFTER_END_S = 10.0

    def __init__(
        self,
        address: str,
        run_id: str,
        offset: int,
        token: str | None = None,
        max_buffer_chars: int = 8_000_000,
    ) -> None:
        self.run_id = run_id
        self._url = f"ws{address.removeprefix('http')}/api/jobs/{run_id}/logs/tail"
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._max = max_buffer_chars
        self._cond = threading.Condition()
        self._parts: list[str] = []
        self._buffered = 0
        self._received = offset  # characters of the log received so far (taken or buffered)
        self._ended_at: datetime | None = None  # when Ray last closed the stream normally
        self.missing = False  # Ray does not know the job
        self._ws: ClientConnection | None = None
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=f"log-tail-{run_id}", daemon=True)
        self._thread.start()

    def take(self) -> str:
        """Everything received since the last take."""
        with self._cond:
            text = "".join(self._parts)
            self._parts.clear()
            self._buffered = 0
            self._cond.notify_all()
        return text

    def complete_since(self, seen_ended_at: datetime) -> bool:
        """Whether Ray has closed the stream normally after ``seen_ended_at`` (when the run was
        known to have ended): everything has then been received."""
        with self._cond:
            ended = self._ended_at
        return self.missing or (ended is not None and ended >= seen_ended_at)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            ws = self._ws
            self._cond.notify_all()
        if ws is not None:
            ws.close()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._closed:
            delay = self.RECONNECT_S
            try:
                if self._connect_once():
                    # Normally the log is complete and the follower closes this tail soon;
                    # Ray may also close early (ray issue 57002): then reconnect, not at once.
                    delay = self.AFTER_END_S
            except InvalidStatus as exc:
                self.missing = exc.response.status_code == 404
                if not self.missing:
                    log.warning("log tail of %s refused: %s", self.run_id, exc)
            except (OSError, TimeoutError, WebSocketException) as exc:
                if not self._closed:
                    log.info("log tail of %s broke (%r); reconnecting", self.run_id, exc)
            with self._cond:
                self._cond.wait_for(lambda: self._closed, timeout=delay)

    def _connect_once(self) -> bool:
        """Follow one connection to its end; whether Ray closed it normally."""
        # No compression: Ray's dashboard proxies the handshake headers to its job module but
        # not the negotiated extension, and breaks the stream of a client that asks for one.
        with connect(
            self._url,
            additional_headers=self._headers,
            open_timeout=10,
            max_size=None,
            compression=None,
            # A saturated machine may leave a ping unanswered for 20 s (the default): the
            # connection then fails, and the whole log is replayed on the next.
            ping_timeout=PING_TIMEOUT_S,
            close_timeout=CLOSE_TIMEOUT_S,
            logger=_ws_log,
        ) as ws:
            with self._cond:
                if self._closed:
                    return False
                self._ws = ws
                self.missing = False
            skip = self._received  # the stream starts over: drop what was received before
            try:
                for message in ws:
                    text = message if isinstance(message, str) else message.decode()
                    if skip:
                        dropped = min(skip, len(text))
                        skip -= dropped
                        text = text[dropped:]
                    if text:
                        self._append(text)
            except ConnectionClosedOK:
                pass
            finally:
                with self._cond:
                    self._ws = None
        if self._closed or ws.close_code != 1000:
            return False
        with self._cond:
            self._ended_at = utcnow()
        return True

    def _append(self, text: str) -> None:
        with self._cond:
            self._cond.wait_for(lambda: self._closed or self._buffered < self._max)
            self._parts.append(text)
            self._buffered += len(text)
            self._received += len(text)
