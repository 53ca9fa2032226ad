"""``create_app(settings)``: the FastAPI application and the lifespan that owns its resources."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import threading
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from types import FrameType

import anyio.to_thread
from fastapi import FastAPI
from starlette.middleware.trustedhost import TrustedHostMiddleware

from service import dashboard, listeners
from service.api import (
    admin,
    browser,
    grants,
    openapi,
    probes,
    prometheus,
    recipes,
    run_metrics,
    runs,
    script,
    usage,
    verl,
    webhooks,
    whoami,
)
from service.api import cluster as cluster_api
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
from service.backoff import Backoff
from service.cluster import embedded_trust, job_user
from service.cluster import registry as registry_of_clusters
from service.cluster import spec as cluster_spec
from service.cluster.embedded_trust import StartRefused
from service.cluster.job_user import JobUserError
from service.cluster.local_ray import LocalRayCluster, PortInUse
from service.cluster.registry import Clusters
from service.loops import strays
from service.loops.base import Loop
from service.loops.cluster_health import ClusterHealth
from service.loops.drains import DrainWatch, gcs_address
from service.loops.follower import Follower
from service.loops.reconciler import Reconciler
from service.loops.strays import StrayProcesses
from service.loops.submitter import Submitter
from service.loops.unmanaged import UnmanagedJobs
from service.loops.watchdog import Watchdog
from service.metrics import samples, store
from service.metrics.broker import Broker
from service.metrics.health import HealthRules
from service.metrics.rl_signals import SignalRules
from service.notify.guard import AllowList
from service.notify.sender import Notifier
from service.recipes.registry import RecipeRegistry, default_registry
from service.recipes.tiny_grpo import default_checkpoint_root
from service.recovery.retry import RetryConfig
from service.scheduling import backlog
from service.scheduling.budgets import Budgets
from service.settings import Settings
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
        local = await _start_local(settings, specs)
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

    app = FastAPI(
        title="rlrun",
        summary="Asynchronous RL training runs on a shared Ray cluster",
        version="0.1.0",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        # The service's metrics are its own (Prometheus, /metrics). FastAPI's OpenTelemetry hook
        # asks the global providers, through the environment, on every request: off.
        telemetry={"tracing": False, "metrics": False, "logs": False},
    )
    app.state.telemetry = Telemetry()
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
    browser.install(app)
    # Routes are matched in this order.
    for api in (
        probes,
        webhooks,
        usage,
        runs,
        script,
        recipes,
        cluster_api,
        run_metrics,
        prometheus,
        verl,
        admin,
        whoami,
        grants,
    ):
        app.include_router(api.router)
    dashboard.install(app)
    openapi.install(app)
    return app


async def _start_local(
    settings: Settings, specs: list[cluster_spec.ClusterSpec]
) -> dict[str, LocalRayCluster]:
    """Start the embedded Ray head of each cluster declared ``local``, at once; none is left
    running if one fails to start."""
    if not any(spec.local is not None for spec in specs):
        return {}
    # Made for the jobs' user if missing; one that exists keeps its owner and mode.
    checkpoints = [
        Path(settings.tiny_grpo_checkpoint_root or default_checkpoint_root(settings.instance_name)),
        Path(settings.verl_checkpoint_root),
    ]
    made: set[Path] = set()
    # Each embedded cluster of a clusters file runs as a user of its own: none reads another's.
    trust = {}
    try:
        for spec in specs:
            if spec.local is not None:
                trust[spec.name] = await asyncio.to_thread(
                    embedded_trust.prepare,
                    settings,
                    checkpoints,
                    spec.local.user if settings.clusters_file else settings.local_job_user,
                    job_user.default_name(
                        settings.instance_name,
                        spec.name if settings.clusters_file else None,
                    ),
                    made,
                )
    except (StartRefused, JobUserError) as exc:
        log.error("cannot start the local Ray cluster: %s", exc)
        raise
    heads = {
        spec.name: LocalRayCluster(
            spec.local.npus,
            cpus_per_node=spec.local.cpus_per_node,
            # The one embedded head of RLRUN_RAY_ADDRESS=local keeps its settings' dir.
            base_dir=settings.local_ray_dir if not settings.clusters_file else None,
            port=spec.local.port,
            dashboard_port=spec.local.dashboard_port,
            state_dir=settings.local_ray_state_path,
            user=trust[spec.name].user,
            python=trust[spec.name].python,
        )
        for spec in specs
        if spec.local is not None
    }
    for name, head in heads.items():
        log.info("starting a local Ray head %r with NPUs per node %s", name, head.npus_per_node)
    results = await asyncio.gather(
        *(asyncio.to_thread(h.start) for h in heads.values()), return_exceptions=True
    )
    failed = [r for r in results if isinstance(r, BaseException)]
    if failed:
        await asyncio.gather(*(asyncio.to_thread(h.cleanup) for h in heads.values()))
        if isinstance(failed[0], PortInUse):
            log.error("cannot start the local Ray cluster: %s", failed[0])
        raise failed[0]
    return heads


def build_services(
    settings: Settings, registry: RecipeRegistry, clusters: Clusters, secrets: SecretStore
) -> Services:
    """Everything one replica runs on, built once: the database, the clusters (a Ray client
    and an inventory each), the event broker and (with ``run_loops``) the background loops,
    wired to wake each other."""
    db = dbmod.Database(
        settings.database_url.get_secret_value(),
        wait_s=settings.db_wait_s,
        pool_size=settings.db_pool_size,
        max_overflow=settings.db_max_overflow,
    )
    broker = Broker(db, settings.events_poll_s)
    loops: dict[str, Loop] = {}
    follower = None
    if settings.run_loops:
        owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        submitter = Submitter(
            db,
            clusters,
            None,
            backlog.quotas(settings),
            owner,
            settings.claim_ttl_s,
            settings.submit_batch,
            secrets,
            grant_url=settings.service_url,
            grant_ttl_s=settings.grant_ttl_s,
            groups=backlog.node_groups(settings),
            budgets=Budgets.of_settings(settings),
            half_life_s=settings.fair_share_half_life_s,
            preemption=backlog.preemption_policy(settings),
            team_max_duration_s=settings.team_max_duration_s,
        )
        reconciler = Reconciler(
            db,
            clusters,
            on_end=lambda: loops["submitter"].wake(),
            interval_s=settings.reconcile_interval_s,
            max_backoff_s=settings.max_backoff_s,
            retry_config=retry_config(settings),
            deadline_margin_s=settings.deadline_margin_s,
        )
        watchdog = Watchdog(
            db,
            settings.stuck_submitted_s,
            settings.stuck_silent_s,
            settings.stop_stuck,
            on_stop=lambda: loops["reconciler"].wake(),
            ray=clusters,
            unschedulable_after_s=settings.unschedulable_after_s,
        )
        follower = Follower(
            db,
            clusters,
            owner,
            settings.follower_lease_s,
            settings.log_keep_chars,
            HealthRules(
                settings.stall_after_s,
                settings.collapse_window,
                settings.collapse_patience,
                settings.collapse_drop,
                signals=SignalRules(
                    settings.signal_window, settings.idle_gap, settings.signal_growth
                ),
            ),
            broker.notify,
            on_end=lambda: loops["submitter"].wake(),
            limits=store.Limits(settings.metric_keys_per_run, settings.metric_points_per_run),
            sample_bounds=samples.Bounds(
                settings.samples_per_step, settings.samples_per_run, settings.samples_chars_per_run
            ),
            claim_new=settings.follower_claim_new,
            retry=retry_config(settings),
            on_retry=lambda: loops["submitter"].wake(),
            on_checkpoint=lambda: loops["reconciler"].wake(),
            target_within_s=settings.default_stop_within_s,
        )
        notifier = Notifier(
            db,
            owner,
            AllowList.parse(settings.webhook_allow),
            settings.service_url,
            timeout_s=settings.webhook_timeout_s,
            backoff=Backoff(settings.webhook_retry_s, 3600.0),
            max_age_s=settings.webhook_max_age_s,
            claim_s=settings.webhook_claim_s,
        )
        health = ClusterHealth(
            db,
            clusters,
            settings.cluster_down_after_s,
            probe_timeout_s=min(settings.ray_timeout_s, 2 * settings.cluster_probe_interval_s),
            retry=retry_config(settings),
            on_change=lambda: loops["submitter"].wake(),
        )
        backoff = settings.max_backoff_s
        if settings.clusters_file:  # one cluster alone has nowhere else to send its runs
            loops["clusters"] = Loop(
                "clusters", health.tick, settings.cluster_probe_interval_s, backoff
            )
        loops |= {
            "notifier": Loop(
                "notifier", notifier.tick, settings.webhook_interval_s, backoff, notifier.close
            ),
            "submitter": Loop("submitter", submitter.tick, settings.submit_interval_s, backoff),
            "reconciler": Loop(
                "reconciler", reconciler.tick, settings.reconcile_interval_s, backoff
            ),
            "watchdog": Loop("watchdog", watchdog.tick, settings.watchdog_interval_s, backoff),
            "follower": Loop("follower", follower.tick, settings.follow_interval_s, backoff),
            "unmanaged": Loop(
                "unmanaged",
                UnmanagedJobs(db, clusters, None, settings.stop_unmanaged_after_s).tick,
                settings.reconcile_interval_s,
                backoff,
            ),
        }
        if any(gcs_address(handle) for handle in clusters):  # a draining node saves first
            drains = DrainWatch(db, clusters, gcs_address, settings.preemption_grace_s)
            drains.on_change = lambda: loops["reconciler"].wake()
            interval = settings.reconcile_interval_s
            loops["drains"] = Loop("drains", drains.tick, interval, backoff, drains.close)
        if any(handle.local is not None for handle in clusters):
            loops["strays"] = Loop(
                "strays", StrayProcesses(db, clusters).tick, settings.reconcile_interval_s, backoff
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


def retry_config(settings: Settings) -> RetryConfig:
    return RetryConfig(
        settings.retry_default, dict(settings.team_retry_max_attempts), settings.retry_max_attempts
    )
