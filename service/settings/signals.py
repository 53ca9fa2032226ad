"""Sections of what runs tell: metrics and health from them, live streams, webhooks."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field, model_validator

from service.settings.base import Names, Section


class MetricsSettings(Section):
    """Metrics: the log follower, its lease, the kept log copy, health from metrics, live
    streams."""

    heading: ClassVar[str] = "Metrics and live streams"

    follow_interval_s: float = 1.0
    """How often active runs' logs are read."""
    follower_lease_s: float = 15.0
    """A replica's hold on the runs it follows; past it another replica takes them."""
    follower_claim_new: int = Field(default=100, ge=1)
    """Runs no replica follows yet that one replica starts following per tick (replicas started
    together share them); runs of a replica whose lease lapsed are all taken at once."""
    log_keep_chars: int = 8_000_000
    """Characters of a run's log kept in the database (the newest)."""
    samples_per_step: int = Field(default=1024, ge=1)
    """Rollout samples one step of a run keeps at most (the rest of the step are counted as
    skipped)."""
    samples_per_run: int = Field(default=100_000, ge=1)
    """Rollout samples one run keeps at most; past it, old steps are thinned (never the
    newest)."""
    samples_chars_per_run: int = Field(default=64_000_000, ge=1)
    """Characters of rollout sample text one run keeps at most; past it, old steps are thinned
    (never the newest)."""
    stall_after_s: float = 600.0
    """Health stalled: a RUNNING run logs no new step this long."""
    collapse_window: int = 20
    """Health collapsed: the newest rewards whose best the last ones are measured against."""
    collapse_patience: int = 3
    """Health collapsed: the last this many rewards all below (1 - collapse_drop) x the best
    of the window."""
    collapse_drop: float = 0.5
    """Health collapsed: the fraction of the window's best reward lost."""
    events_poll_s: float = 1.0
    """How often live streams look for another replica's writes (on PostgreSQL its status
    events come at once, told by NOTIFY; its metric lines at this poll)."""
    signal_window: int = Field(default=10, ge=2)
    """Health from verl's fully async metrics (staleness drift, a growing weight sync, idle
    imbalance): the steps each signal reads."""
    idle_gap: float = Field(default=0.3, gt=0, le=1)
    """Health idle_imbalance: how far apart the trainer's and the rollouter's mean idle ratio
    over the window may be."""
    signal_growth: float = Field(default=1.5, gt=1)
    """Health sync_growing and staleness_drift: how many times the weight sync's time, or the
    stale trajectories per step, of the newest half-window may be those of the run's first
    window."""


class WebhookSettings(Section):
    """Webhooks: where they may call, how often, how long they are retried."""

    heading: ClassVar[str] = "Webhooks"

    webhook_allow: Names = []
    """Where webhooks may call besides public addresses: host names or CIDRs, e.g.
    "127.0.0.1/32,hooks.internal"."""
    webhook_interval_s: float = Field(default=0.5, gt=0)
    """How often the outbox is read."""
    webhook_timeout_s: float = Field(default=10.0, gt=0, le=60)
    """How long a receiver may take."""
    webhook_retry_s: float = Field(default=5.0, gt=0)
    """The first retry's delay (doubling after)."""
    webhook_max_age_s: float = Field(default=24 * 3600.0, gt=0)
    """How long a delivery is retried."""
    webhook_claim_s: float = Field(default=50.0, gt=0)
    """A delivery claimed by a replica that died is sent again (same webhook-id) this long after
    the claim; more than twice webhook_timeout_s, so that a send still running is never
    claimed by another replica."""

    @model_validator(mode="after")
    def _claim_outlasts_a_send(self) -> WebhookSettings:
        if self.webhook_claim_s <= 2 * self.webhook_timeout_s:
            raise ValueError(
                "RLRUN_WEBHOOK_CLAIM_S must be more than twice RLRUN_WEBHOOK_TIMEOUT_S"
            )
        return self
