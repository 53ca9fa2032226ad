"""Serving the API and migrating its database (``rlrun serve``, ``rlrun migrate``)."""

from __future__ import annotations

import errno
import gc
import socket
import sys
from typing import Annotated, Any

import typer
from pydantic import ValidationError

from service.cli.common import console, errors, say, usage_error
from service.client import DEFAULT_HOST, DEFAULT_PORT


def serve(
    host: Annotated[str, typer.Option(help="Address to bind")] = DEFAULT_HOST,
    port: Annotated[
        int, typer.Option(help="Port to bind (pick another if it is taken)", min=0, max=65535)
    ] = DEFAULT_PORT,
    probe_port: Annotated[
        int | None,
        typer.Option(
            help="Also answer /healthz and /readyz on this port, from a process of their own"
        ),
    ] = None,
) -> None:
    """Run the service on HOST:PORT (with RLRUN_RAY_ADDRESS=local, it starts and stops a
    local Ray head); a port already in use is refused before anything starts.

    Authentication is on whenever HOST is not a loopback address (RLRUN_AUTH=auto). On
    SIGTERM, live event streams end at once and other open requests get RLRUN_SHUTDOWN_GRACE_S
    to finish."""
    import uvicorn

    from service.app import create_app
    from service.settings import Settings

    try:
        given: dict[str, Any] = {"listen_host": host, "listen_port": port}
        if probe_port is not None:  # else RLRUN_PROBE_PORT, if set
            given["probe_port"] = probe_port
        settings = Settings(**given)
    except ValidationError as exc:
        # One line per error naming the variable, not a traceback.
        for error in exc.errors():
            where = "".join(f"RLRUN_{str(part).upper()}: " for part in error["loc"][:1])
            say(f"{where}{error['msg'].removeprefix('Value error, ')}", style="red", to=errors)
        raise typer.Exit(2) from None
    if problem := port_problem(host, port):
        usage_error(problem)
    # Hand the interpreter lock over every millisecond (default 5): the event loop, which
    # answers /healthz and feeds live streams, waits less behind busy worker threads.
    sys.setswitchinterval(0.001)
    served = create_app(settings)
    # What the imports and the app made lives as long as the process: out of the cyclic
    # collector's sight, so that a full collection walks only what requests leave behind (it
    # walked some 160,000 objects, a pause of 100-250 ms on every request in flight).
    gc.collect()
    gc.freeze()
    uvicorn.run(
        served,
        host=host,
        port=port,
        log_level="info",
        access_log=settings.access_log,
        timeout_graceful_shutdown=max(1, round(settings.shutdown_grace_s)),
        # Proxy headers only from the proxies named: otherwise any caller could name its address.
        proxy_headers=bool(settings.forwarded_allow_ips),
        forwarded_allow_ips=settings.forwarded_allow_ips or None,
    )


def port_problem(host: str, port: int) -> str | None:
    """Why ``host:port`` cannot be served, found by binding it as uvicorn will (address reuse
    on), before the service starts a Ray head only to fail at the end of its start-up."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        return f"--host {host}: {exc.strerror}"
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return f"port {port} on {host} is in use: pick another with --port"
            return f"cannot bind {host}:{port}: {exc.strerror or exc}"
    return None


def migrate() -> None:
    """Upgrade the database in RLRUN_DATABASE_URL to the newest schema."""
    from service.settings import Settings
    from service.store.db import upgrade

    upgrade(Settings().database_url.get_secret_value())
    console.print("database is at head")
