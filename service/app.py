"""``create_app(settings)``: the FastAPI application and the lifespan that owns its resources."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager

import anyio.to_thread
from fastapi import FastAPI
from starlette.middleware.trustedhost import TrustedHostMiddleware

from service import dashboard, listeners
from service.api import browser, openapi, routers
from service.api.body_limit import BodyLimit
from service.api.deps import Services
from service.api.direct import DirectAccept, DirectRunReads
from service.api.oidc import OidcVerifier
from service.api.open_mode import OpenModeGuard
from service.api.overload import ShedLoad
from service.api.probe_process import ProbeProcess
from service.api.problems import install_handlers
from service.api.read_cache import ReadCache, shown_change
from service.api.token_cache import TokenCache
from service.cluster import registry as registry_of_clusters
from service.cluster import spec as cluster_spec
from service.cluster.local_heads import start_local_heads
from service.cluster.local_ray import LocalRayCluster
from service.cluster.registry import Clusters
from service.loops import strays
from service.loops.table import build_loops
from service.metrics.broker import Broker
from service.recipes.registry import RecipeRegistry, default_registry
from service.settings import Settings
from service.shutdown import on_shutdown_signal
from service.store import db as dbmod
from service.store.change_feed import ChangeFeed
from service.store.changes import Changes
from service.team_secrets import SecretStore
from service.telemetry import Telemetry, TimeRequests

log = logging.getLogger(__name__)


def create_app(settings: Settings | None = None, registry: RecipeRegistry | None = None) -> FastAPI:
    settings = settings or Settings()
    registry = registry or default_registry(settings.recipe_plugins, settings)
    listeners.register()  # before any run changes: the outbox, usage and failures hear them
    app = FastAPI(
        title="rlrun",
        summary="Asynchronous RL training runs on a shared Ray cluster",
        version="0.1.0",
        lifespan=_lifespan(settings, registry),
        docs_url=None,
        redoc_url=None,
        # The service's metrics are its own (Prometheus, /metrics). FastAPI's OpenTelemetry hook
        # asks the global providers, through the environment, on every request: off.
        telemetry={"tracing": False, "metrics": False, "logs": False},
    )
    app.state.telemetry = Telemetry()
    _middleware(app, settings)
    browser.install(app)
    for api in routers.ROUTERS:
        app.include_router(api.router)
    dashboard.install(app)
    openapi.install(app)
    return app


def _middleware(app: FastAPI, settings: Settings) -> None:
    """The middleware, innermost first: the direct answers, load shedding, the body limit, the
    problem handlers, hosts, open mode's guard, the browser's headers, request timing."""
    app.add_middleware(DirectRunReads)
    app.add_middleware(DirectAccept)
    app.add_middleware(
        ShedLoad,
        limit=settings.max_requests_in_progress,
        inside=2 * settings.request_threads,
        wait_s=settings.max_request_wait_s,
        watch=app.state.telemetry.watch_door,
    )
    app.add_middleware(
        BodyLimit, max_bytes=settings.max_body_bytes, timeout_s=settings.body_timeout_s
    )
    install_handlers(app)
    app.add_middleware(TrustedHostMiddleware, allowed_hosts=settings.allowed_hosts)
    if not settings.auth_enabled:
        app.add_middleware(OpenModeGuard, extra_hosts=settings.open_mode_host_names)
    app.add_middleware(browser.SecurityHeaders)
    app.add_middleware(TimeRequests, telemetry=app.state.telemetry)


def _lifespan(
    settings: Settings, registry: RecipeRegistry
) -> Callable[[FastAPI], AbstractAsyncContextManager[None]]:
    """What the app owns while it serves: the embedded heads, the services, the loops, the
    change feed and the probe process, each closed at shutdown."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if not settings.auth_enabled:
            log.warning(
                "authentication is OFF (RLRUN_AUTH=%s, listening on %s): every caller acts as "
                "an admin; set RLRUN_AUTH=on before exposing the service",
                settings.auth,
                settings.listen_host,
            )
        anyio.to_thread.current_default_thread_limiter().total_tokens = settings.request_threads
        if settings.migrate_on_start:
            await asyncio.to_thread(dbmod.upgrade, settings.database_url.get_secret_value())
        specs = cluster_spec.declared(settings)  # a bad clusters file stops the start here
        local = await start_local_heads(settings, specs)
        try:
            secrets = SecretStore(settings.secrets_dir)
            clusters = registry_of_clusters.build(settings, specs, secrets, local)
            services = app.state.services = build_services(settings, registry, clusters, secrets)
        except BaseException:
            await asyncio.gather(*(asyncio.to_thread(c.cleanup) for c in local.values()))
            raise
        app.state.telemetry.watch(services)
        await services.db.open_async()
        stop = asyncio.Event()
        tasks = [asyncio.create_task(loop.run(stop)) for loop in services.loops.values()]
        feed: asyncio.Task[None] | None = None
        if services.feed is not None:
            # Until cancelled at shutdown: a wait for notifications has no tick to stop at.
            feed = asyncio.create_task(services.feed.run(_told_by_others(services)))
        probe: ProbeProcess | None = None
        try:
            if services.feed is not None:
                # Listening before the first request: no answer kept while a write goes untold.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(services.feed.listening.wait(), settings.db_wait_s)
            probe = _probe_process(settings, clusters)
            if probe is not None:
                tasks.append(asyncio.create_task(probe.heartbeat(stop)))
            with on_shutdown_signal(services.broker.close_streams):
                yield
        finally:
            stop.set()
            if feed is not None:
                feed.cancel()
                tasks.append(feed)
            await asyncio.gather(*tasks, return_exceptions=True)
            if probe is not None:
                await asyncio.to_thread(probe.close)
            await _close(services, local)

    return lifespan


async def _close(services: Services, local: dict[str, LocalRayCluster]) -> None:
    """What the services hold, closed once the loops have stopped."""
    await services.broker.close()
    await services.revocations.close()
    if services.follower is not None:
        # Hand this replica's followers over at once rather than when the lease lapses.
        await asyncio.to_thread(services.follower.release)
    services.clusters.close()
    await asyncio.gather(*(asyncio.to_thread(c.cleanup) for c in local.values()))
    # What the stop ended of the job users' processes, recorded while the database is.
    with contextlib.suppress(Exception):
        await asyncio.to_thread(strays.record, services.db, local.items())
    await services.db.dispose_async()
    services.db.dispose()


def build_services(
    settings: Settings, registry: RecipeRegistry, clusters: Clusters, secrets: SecretStore
) -> Services:
    """Everything one replica runs on, built once: the database, the clusters (a Ray client
    and an inventory each), the event broker and (with ``run_loops``) the background loops
    (``loops.table``)."""
    db = dbmod.Database(
        settings.database_url.get_secret_value(),
        wait_s=settings.db_wait_s,
        pool_size=settings.db_pool_size,
        max_overflow=settings.db_max_overflow,
    )
    broker = Broker(db, settings.events_poll_s)
    loops, follower = (
        build_loops(settings, db, clusters, secrets, broker) if settings.run_loops else ({}, None)
    )
    reads = ReadCache(db, settings.read_cache_s)
    signed_in = TokenCache(settings.signin_cache_s)
    db.on_commit(signed_in.changed)
    feed = None
    if db.engine.dialect.name == "postgresql" and (
        settings.read_cache_s > 0 or settings.signin_cache_s > 0
    ):
        # Other replicas drop what this one's writes change (and this one, theirs).
        feed = ChangeFeed(db.url, shown_change)
        db.on_commit(feed.tell)
    oidc = OidcVerifier(settings) if settings.oidc_enabled else None
    return Services(
        settings,
        db,
        registry,
        broker,
        clusters,
        loops,
        follower,
        reads,
        signed_in,
        secrets,
        feed=feed,
        oidc=oidc,
    )


def _told_by_others(services: Services) -> Callable[[Changes], None]:
    """What another replica's write, told by the change feed, refreshes here."""

    def told(changes: Changes) -> None:
        services.signed_in.changed(changes)
        services.reads.changed(changes)
        services.broker.changed(changes)

    return told


def _probe_process(settings: Settings, clusters: Clusters) -> ProbeProcess | None:
    """The probe listener on ``RLRUN_PROBE_PORT``, if one is set."""
    if settings.probe_port is None:
        return None
    config = {
        "database_url": settings.database_url.get_secret_value(),
        "rays": {h.name: [h.ray.address, h.ray.token] for h in clusters},
        "stall_s": settings.probe_stall_s,
    }
    return ProbeProcess(settings.probe_host or settings.listen_host, settings.probe_port, config)
