"""The background loops one replica runs, in one table: each loop's name, what it ticks, how
often, what it closes when stopped, and whether this deployment runs it. Each part is built
from its settings here; a part that finishes something another loop acts on wakes that loop
(``Wakes``), never waits for its interval."""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Callable
from typing import NamedTuple

from service.backoff import Backoff
from service.cluster.registry import Clusters
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
from service.recovery.retry import RetryConfig
from service.scheduling import backlog
from service.scheduling.budgets import Budgets
from service.settings import Settings
from service.store.db import Database
from service.team_secrets import SecretStore


class Row(NamedTuple):
    name: str
    tick: Callable[[], None]
    interval_s: float
    close: Callable[[], None] | None = None
    runs: bool = True  # whether this deployment runs it


class Wakes:
    """Wake-ups by loop name, bound before the loops exist: ``wakes("submitter")`` is a
    callable that runs that loop's next tick now (none if the loop is not run)."""

    def __init__(self) -> None:
        self.loops: dict[str, Loop] = {}

    def __call__(self, name: str) -> Callable[[], None]:
        def wake() -> None:
            if name in self.loops:
                self.loops[name].wake()

        return wake


def retry_config(settings: Settings) -> RetryConfig:
    return RetryConfig(
        settings.retry_default, dict(settings.team_retry_max_attempts), settings.retry_max_attempts
    )


def build_loops(
    settings: Settings, db: Database, clusters: Clusters, secrets: SecretStore, broker: Broker
) -> tuple[dict[str, Loop], Follower]:
    """The loops of one replica (its owner name unique to it) and its log follower."""
    owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
    wakes = Wakes()
    retry = retry_config(settings)
    follower = _follower(settings, db, clusters, owner, broker, retry, wakes)
    health = ClusterHealth(
        db,
        clusters,
        settings.cluster_down_after_s,
        probe_timeout_s=min(settings.ray_timeout_s, 2 * settings.cluster_probe_interval_s),
        retry=retry,
        on_change=wakes("submitter"),
    )
    notifier = _notifier(settings, db, owner)
    drains = DrainWatch(db, clusters, gcs_address, settings.preemption_grace_s)
    drains.on_change = wakes("reconciler")
    submitter = _submitter(settings, db, clusters, owner, secrets)
    reconciler = _reconciler(settings, db, clusters, retry, wakes)
    watchdog = _watchdog(settings, db, clusters, wakes)
    unmanaged = UnmanagedJobs(db, clusters, None, settings.stop_unmanaged_after_s)
    reconcile, multi = settings.reconcile_interval_s, bool(settings.clusters_file)
    table = [
        # One cluster alone has nowhere else to send its runs: no round over the clusters.
        Row("clusters", health.tick, settings.cluster_probe_interval_s, None, multi),
        Row("notifier", notifier.tick, settings.webhook_interval_s, notifier.close),
        Row("submitter", submitter.tick, settings.submit_interval_s),
        Row("reconciler", reconciler.tick, reconcile),
        Row("watchdog", watchdog.tick, settings.watchdog_interval_s),
        Row("follower", follower.tick, settings.follow_interval_s),
        Row("unmanaged", unmanaged.tick, reconcile),
        # A draining node's runs save first, where Ray can say a node drains.
        Row("drains", drains.tick, reconcile, drains.close, any(map(gcs_address, clusters))),
        Row("strays", StrayProcesses(db, clusters).tick, reconcile, None, _any_local(clusters)),
    ]
    wakes.loops = {
        row.name: Loop(row.name, row.tick, row.interval_s, settings.max_backoff_s, row.close)
        for row in table
        if row.runs
    }
    return wakes.loops, follower


def _any_local(clusters: Clusters) -> bool:
    return any(handle.local is not None for handle in clusters)


def _submitter(
    settings: Settings, db: Database, clusters: Clusters, owner: str, secrets: SecretStore
) -> Submitter:
    return Submitter(
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


def _reconciler(
    settings: Settings, db: Database, clusters: Clusters, retry: RetryConfig, wakes: Wakes
) -> Reconciler:
    return Reconciler(
        db,
        clusters,
        on_end=wakes("submitter"),
        interval_s=settings.reconcile_interval_s,
        max_backoff_s=settings.max_backoff_s,
        retry_config=retry,
        deadline_margin_s=settings.deadline_margin_s,
    )


def _watchdog(settings: Settings, db: Database, clusters: Clusters, wakes: Wakes) -> Watchdog:
    return Watchdog(
        db,
        settings.stuck_submitted_s,
        settings.stuck_silent_s,
        settings.stop_stuck,
        on_stop=wakes("reconciler"),
        ray=clusters,
        unschedulable_after_s=settings.unschedulable_after_s,
    )


def _follower(
    settings: Settings,
    db: Database,
    clusters: Clusters,
    owner: str,
    broker: Broker,
    retry: RetryConfig,
    wakes: Wakes,
) -> Follower:
    signals = SignalRules(settings.signal_window, settings.idle_gap, settings.signal_growth)
    return Follower(
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
            signals=signals,
        ),
        broker.notify,
        on_end=wakes("submitter"),
        limits=store.Limits(settings.metric_keys_per_run, settings.metric_points_per_run),
        sample_bounds=samples.Bounds(
            settings.samples_per_step, settings.samples_per_run, settings.samples_chars_per_run
        ),
        claim_new=settings.follower_claim_new,
        retry=retry,
        on_retry=wakes("submitter"),
        on_checkpoint=wakes("reconciler"),
        target_within_s=settings.default_stop_within_s,
    )


def _notifier(settings: Settings, db: Database, owner: str) -> Notifier:
    return Notifier(
        db,
        owner,
        AllowList.parse(settings.webhook_allow),
        settings.service_url,
        timeout_s=settings.webhook_timeout_s,
        backoff=Backoff(settings.webhook_retry_s, 3600.0),
        max_age_s=settings.webhook_max_age_s,
        claim_s=settings.webhook_claim_s,
    )
