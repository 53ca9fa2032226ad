"""``create_app(settings)``: the FastAPI application and the lifespan that owns its resources."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from service import dashboard
from service.api import cluster as cluster_api
from service.api import (
    probes,
    prometheus,
    recipes,
    run_metrics,
    runs,
    script,
    verl,
)
from service.api.deps import Services
from service.cluster.local_ray import LocalRayCluster
from service.cluster.ray_jobs import RayJobs
from service.errors import install_handlers
from service.loops.base import Loop
from service.loops.follower import Follower
from service.loops.reconciler import Reconciler
from service.loops.submitter import Submitter
from service.loops.watchdog import Watchdog
from service.metrics.broker import Broker
from service.metrics.health import HealthRules
from service.recipes.registry import RecipeRegistry, default_registry
from service.scheduling import backlog
from service.scheduling.inventory import InventoryCache
from service.settings import Settings
from service.store import db as dbmod

log = logging.getLogger(__name__)


def create_app(settings: Settings | None = None, registry: RecipeRegistry | None = None) -> FastAPI:
    settings = settings or Settings()
    registry = registry or default_registry(settings.recipe_plugins, settings)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if settings.migrate_on_start:
            await asyncio.to_thread(dbmod.upgrade, settings.database_url)
        cluster: LocalRayCluster | None = None
        address = settings.ray_address
        if settings.uses_local_ray:
            cluster = LocalRayCluster(
                settings.local_npus_per_node,
                settings.local_cpus_per_node,
                settings.local_ray_dir,
                settings.local_ray_port,
                settings.local_dashboard_port,
            )
            log.info("starting a local Ray head with NPUs per node %s", settings.local_npus)
            await asyncio.to_thread(cluster.start)
            address = cluster.address
        services = app.state.services = build_services(settings, registry, address)
        stop = asyncio.Event()
        tasks = [asyncio.create_task(loop.run(stop)) for loop in services.loops.values()]
        try:
            yield
        finally:
            stop.set()
            await asyncio.gather(*tasks, return_exceptions=True)
            await services.broker.close()
            if services.follower is not None:
                # Hand this replica's followers over at once rather than when the lease lapses.
                await asyncio.to_thread(services.follower.release)
            services.ray.close()
            services.db.dispose()
            if cluster is not None:
                await asyncio.to_thread(cluster.cleanup)

    app = FastAPI(
        title="rlrun",
        summary="Asynchronous RL training runs on a shared Ray cluster",
        version="0.1.0",
        lifespan=lifespan,
        max_body_size=settings.max_body_bytes,
    )
    install_handlers(app)
    app.include_router(probes.router)
    app.include_router(runs.router)
    app.include_router(script.router)
    app.include_router(recipes.router)
    app.include_router(cluster_api.router)
    app.include_router(run_metrics.router)
    app.include_router(prometheus.router)
    app.include_router(verl.router)
    dashboard.install(app)
    return app


def build_services(settings: Settings, registry: RecipeRegistry, ray_address: str) -> Services:
    """Everything one replica runs on, built once: the database, the Ray client, the inventory,
    the event broker and (with ``run_loops``) the background loops, wired to wake each other."""
    db = dbmod.Database(settings.database_url)
    ray = RayJobs(ray_address, settings.ray_token, settings.ray_timeout_s)
    inventory = InventoryCache(ray, settings.inventory_ttl_s)
    broker = Broker(db, settings.events_poll_s)
    loops: dict[str, Loop] = {}
    follower = None
    if settings.run_loops:
        owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        submitter = Submitter(
            db,
            ray,
            inventory,
            backlog.quotas(settings),
            owner,
            settings.claim_ttl_s,
            settings.submit_batch,
        )
        reconciler = Reconciler(db, ray, on_end=lambda: loops["submitter"].wake())
        watchdog = Watchdog(
            db,
            settings.stuck_submitted_s,
            settings.stuck_silent_s,
            settings.stop_stuck,
            on_stop=lambda: loops["reconciler"].wake(),
        )
        follower = Follower(
            db,
            ray,
            owner,
            settings.follower_lease_s,
            settings.log_keep_chars,
            HealthRules(
                settings.stall_after_s,
                settings.collapse_window,
                settings.collapse_patience,
                settings.collapse_drop,
            ),
            broker.notify,
        )
        backoff = settings.max_backoff_s
        loops |= {
            "submitter": Loop("submitter", submitter.tick, settings.submit_interval_s, backoff),
            "reconciler": Loop(
                "reconciler", reconciler.tick, settings.reconcile_interval_s, backoff
            ),
            "watchdog": Loop("watchdog", watchdog.tick, settings.watchdog_interval_s, backoff),
            "follower": Loop("follower", follower.tick, settings.follow_interval_s, backoff),
        }
    return Services(settings, db, registry, broker, ray, inventory, loops, follower)
