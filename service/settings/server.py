"""Sections of the service itself: the database it shares with its replicas, and its HTTP
server."""

from __future__ import annotations

from typing import ClassVar
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, field_validator

from service.client import DEFAULT_PORT
from service.settings.base import Names, Section


class DatabaseSettings(Section):
    """The database every replica shares: runs, metrics, audit rows and tokens."""

    heading: ClassVar[str] = "Database"

    database_url: SecretStr = SecretStr("sqlite:///rlrun.db")
    """SQLAlchemy URL of the database (SQLite file or ``postgresql+psycopg://``); a secret, as
    it may carry a password."""
    db_wait_s: float = 5.0
    """The longest anything waits for the database (a turn to write, a pooled connection, a
    lock); past it a request answers 503 with Retry-After."""
    db_pool_size: int = 20
    """Connections kept open. The pool serves the request threads, the background loops (4)
    and the live event streams' reads. On PostgreSQL the reads awaited on the event loop (a
    run's page, a token's sign-in) have a pool of their own: at most the smaller of this and
    16 connections, 4 of them made at start and kept."""
    db_max_overflow: int = 30
    """Connections opened past the pool's size at a peak, closed when returned."""
    read_cache_s: float = Field(default=1.0, ge=0)
    """How long an answer of GET /runs/{id} or GET /runs may be served again without reading
    the database. Writes refresh it at once: this replica's, and on PostgreSQL another replica's
    (told by NOTIFY); only one whose notification was lost, or on SQLite another process's, can
    go unseen, and for no longer than this. 0: every read reads the database."""
    migrate_on_start: bool = True
    """Upgrade the schema at start (else ``rlrun migrate`` does)."""


class ServerSettings(Section):
    """The HTTP server: where it listens, how it is reached, how much it takes at once."""

    heading: ClassVar[str] = "HTTP server"

    listen_host: str = "127.0.0.1"
    """The address the API listens on (set by ``rlrun serve --host``)."""
    listen_port: int = DEFAULT_PORT
    """The API's port (set by ``rlrun serve --port``)."""
    public_url: str | None = None
    """The service's URL as the cluster and people reach it: a job redeems its secrets grant
    there, webhook messages link there (unset: http://<listen host>:<listen port>, loopback for
    a wildcard host)."""
    request_threads: int = 32
    """Worker threads for requests. Python runs one at a time, but a thread waiting for the
    database runs none: accepts that wait while one commits are stored together, so more
    threads make fuller transactions. At 64 clients on PostgreSQL, 32 accepted 40 % more than
    8 (64 more again), and reads made meanwhile were answered twice as fast (the door lets up
    to twice this many requests in: see ``max_request_wait_s``); 64 slowed those reads again."""
    max_requests_in_progress: int = 128
    """Requests waiting for their answer (for a thread included) past which new ones get a 503
    with Retry-After at once, so that the admitted ones never wait long (/healthz: never)."""
    max_request_wait_s: float = Field(default=2.0, gt=0)
    """The longest a request waits to be started; past it, a 503 with Retry-After instead of a
    late answer. Up to twice request_threads are in at a time, fewer while the event loop lags
    or answers take longer than a quarter of this (a CPU that other work takes, a slow
    database), so that the ones let in are answered promptly."""
    access_log: bool = False
    """A line per request on the server's log (uvicorn's access log). Off by default: at
    hundreds of requests a second it costs a tenth of a request's time, and the audit trail
    (every write, with its caller), the request metrics (/metrics) and a proxy's own log
    already tell who asked what."""
    shutdown_grace_s: float = 10.0
    """SIGTERM: live event streams end at once; other requests get this long to finish."""
    allowed_hosts: Names = ["*"]
    """Hosts the service answers for (Host header); "*" answers any."""
    forwarded_allow_ips: Names = []
    """Proxies whose X-Forwarded-For/-Proto are believed (uvicorn's forwarded_allow_ips: IPs or
    networks, "*" any): the client address of audit rows. Empty: none, the
    socket's peer is the client."""
    probe_port: int | None = Field(default=None, ge=0, le=65535)
    """Liveness and readiness on a listener of their own (a thread and port apart from the
    API's), which a flood of API calls cannot delay; unset: only on the API's port."""
    probe_host: str | None = None
    """The probe listener's address (unset: ``listen_host``)."""
    probe_stall_s: float = Field(default=30.0, gt=0)
    """Liveness fails when the API's event loop has been silent this long (blocked, not merely
    busy)."""

    @field_validator("public_url")
    @classmethod
    def _public_url(cls, value: str | None) -> str | None:
        value = (value or "").strip().rstrip("/") or None
        if value is None:
            return None
        try:
            parts = urlsplit(value)
        except ValueError:
            parts = None
        if parts is None or parts.scheme not in {"http", "https"} or not parts.hostname:
            raise ValueError("expected the service's http(s):// URL as the cluster reaches it")
        if "$" in value or any(c.isspace() for c in value) or parts.query or parts.fragment:
            raise ValueError("expected a plain URL: no '$', spaces, query or fragment")
        return value

    @property
    def service_url(self) -> str:
        """The service as the cluster and people reach it (``public_url`` or derived)."""
        if self.public_url:
            return self.public_url
        host = self.listen_host
        if host in {"", "0.0.0.0", "::", "[::]"}:
            host = "127.0.0.1"
        elif ":" in host and not host.startswith("["):
            host = f"[{host}]"
        return f"http://{host}:{self.listen_port}"
