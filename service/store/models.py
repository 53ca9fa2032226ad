"""SQLAlchemy models: the database is the system of record for runs, events and history."""

from __future__ import annotations

import re
from datetime import UTC, date, datetime
from typing import Any, ClassVar

from sqlalchemy import (
    JSON,
    BigInteger,
    Date,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    SmallInteger,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

from service.clock import utcnow as utcnow
from service.store.status import RunStatus


class UTCDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC datetimes on every backend (SQLite hands back naive ones)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is not None and value.tzinfo is None:
            raise ValueError("naive datetime")
        return value.astimezone(UTC) if value is not None else None

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is not None and value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value


JSONDoc = JSON().with_variant(JSONB(), "postgresql")


_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


class SafeText(TypeDecorator[str]):
    """Text both databases store alike: NUL (which PostgreSQL refuses) and lone surrogates
    become U+FFFD, one character for one, so offsets counted in characters still hold."""

    impl = Text
    cache_ok = True

    def process_bind_param(self, value: str | None, dialect: Dialect) -> str | None:
        return None if value is None else _UNSTORABLE.sub("\ufffd", value)


class Base(DeclarativeBase):
    type_annotation_map: ClassVar[dict[Any, Any]] = {datetime: UTCDateTime, dict[str, Any]: JSONDoc}


class Run(Base):
    __tablename__ = "runs"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    recipe: Mapped[str] = mapped_column(String(64))
    team: Mapped[str] = mapped_column(String(64), index=True)
    priority: Mapped[int] = mapped_column(Integer, default=1)
    status: Mapped[str] = mapped_column(String(16), default=RunStatus.QUEUED)
    health: Mapped[str] = mapped_column(String(16), default="ok")
    health_reason: Mapped[str | None] = mapped_column(SafeText)
    # The validated request, and what the recipe made of it (argv, runtime env, shape, warnings).
    spec: Mapped[dict[str, Any]]
    launch: Mapped[dict[str, Any]]
    idempotency_key: Mapped[str | None] = mapped_column(String(200), unique=True)
    request_hash: Mapped[str | None] = mapped_column(String(64))
    # Who submitted it (the caller's user), for usage by user.
    created_by: Mapped[str | None] = mapped_column(String(200))
    # The admin who let it start although its team is past its budget (audited).
    over_budget_by: Mapped[str | None] = mapped_column(String(200))

    ray_status: Mapped[str | None] = mapped_column(String(16))
    ray_message: Mapped[str | None] = mapped_column(SafeText)
    ray_error_type: Mapped[str | None] = mapped_column(String(64))
    ray_exit_code: Mapped[int | None] = mapped_column(Integer)
    # When the reconciler first saw Ray report the job SUCCEEDED: the run ends once its log is
    # read to the end (service.recovery.ending), so a short run never shows SUCCEEDED.
    ray_ended_at: Mapped[datetime | None]

    # The cluster the run was admitted on (None: not yet); a retry stays there while it is up.
    cluster: Mapped[str | None] = mapped_column(String(63))
    # A replica claims a queued run before it calls Ray; the claim lapses if that replica dies.
    claim_owner: Mapped[str | None] = mapped_column(String(120))
    claim_expires_at: Mapped[datetime | None]
    stop_requested_at: Mapped[datetime | None]
    # Why a queued run waits ("quota: ...", "capacity: ...", "behind ..."), kept by the submitter.
    queue_reason: Mapped[str | None] = mapped_column(SafeText)
    # While it waits for its team's budget, the figures of that reason (``Budgets.held_back``):
    # {month, used_hours, budget_hours, over_by_hours, accelerator}; None otherwise.
    budget_wait: Mapped[dict[str, Any] | None]
    # When the job last printed anything (set by whoever follows its log; read by health checks).
    last_output_at: Mapped[datetime | None]
    # The launcher's preflight report (every node's checks), read from the job log.
    preflight: Mapped[dict[str, Any] | None]
    # Why it ended other than SUCCEEDED: {class, summary, hint, evidence}, once its log is read.
    failure: Mapped[dict[str, Any] | None]
    # The current attempt (1 until a retry), when a retried run may be admitted again, what it
    # resumes from ("checkpoint" | "scratch", None: the first attempt) and the trainer step its
    # job reported resuming from (0: from scratch). Ended attempts are ``RunAttempt`` rows.
    attempt: Mapped[int] = mapped_column(Integer, default=1, server_default="1")
    retry_at: Mapped[datetime | None]
    resume: Mapped[str | None] = mapped_column(String(16))
    resumed_from_step: Mapped[int | None] = mapped_column(BigInteger)
    # How the current attempt ended (FAILED or LOST) while the run is RETRYING.
    attempt_status: Mapped[str | None] = mapped_column(String(16))
    # The newest complete checkpoint of the current attempt (its step, when the job said so).
    checkpoint_step: Mapped[int | None] = mapped_column(BigInteger)
    checkpoint_at: Mapped[datetime | None]
    # The longest wait between two complete saves of the attempt (the first from its start).
    checkpoint_every_s: Mapped[float | None] = mapped_column(Float)
    # A stop at the next checkpoint that waits (``lifecycle.request_yield``): the run stops
    # right after a checkpoint past ``yield_after_step`` (None: any) is complete, or at
    # ``yield_by`` whatever it has saved; it then ends ``yield_then`` (STOPPED, or SUCCEEDED for
    # a reached target) for ``yield_reason``.
    yield_by: Mapped[datetime | None]
    yield_after_step: Mapped[int | None] = mapped_column(BigInteger)
    yield_then: Mapped[str | None] = mapped_column(String(16))
    yield_reason: Mapped[str | None] = mapped_column(SafeText)
    # How such a stop went: the checkpoint step it stopped with (None: none saved) and the
    # steps it had logged past it (0 when the save came first).
    stop_saved_step: Mapped[int | None] = mapped_column(BigInteger)
    stop_lost_steps: Mapped[int | None] = mapped_column(BigInteger)
    # When the current attempt must have ended (admission + max_duration_s; None: never).
    deadline_at: Mapped[datetime | None]
    # Start-up marks: mark -> when the follower first read its line (``metrics.startup``).
    startup: Mapped[dict[str, Any] | None]
    # The current attempt's weight syncs as the digests on each side proved them
    # (``metrics.weight_sync``): what is paired, what waits for its pair, the problem if any.
    weight_syncs: Mapped[dict[str, Any] | None]
    # The last reason it waited in the queue, kept after it left (``queue_reason`` is cleared).
    queued_why: Mapped[str | None] = mapped_column(SafeText)

    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)
    submitted_at: Mapped[datetime | None]
    started_at: Mapped[datetime | None]
    ended_at: Mapped[datetime | None]

    events: Mapped[list[RunEvent]] = relationship(
        back_populates="run", order_by="RunEvent.id", cascade="all, delete-orphan"
    )

    __table_args__ = (Index("ix_runs_status_priority", "status", "priority", "id"),)


class RunEvent(Base):
    __tablename__ = "run_events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    at: Mapped[datetime] = mapped_column(default=utcnow)
    from_status: Mapped[str | None] = mapped_column(String(16))
    to_status: Mapped[str] = mapped_column(String(16))
    reason: Mapped[str] = mapped_column(SafeText)
    # The run's attempt when it happened (None: before attempts were recorded).
    attempt: Mapped[int | None] = mapped_column(Integer)
    # What else it is (None: a change of status or a note): "checkpoint" (a complete save of
    # the step ``step``), "stop_requested", "stopped_at_checkpoint".
    kind: Mapped[str | None] = mapped_column(String(32))
    step: Mapped[int | None] = mapped_column(BigInteger)

    run: Mapped[Run] = relationship(back_populates="events")


class RunAttempt(Base):
    """One ended attempt of a run, as it was when the next one began (the current attempt is
    the run's own row). Keyed by (run, n): an attempt is archived once."""

    __tablename__ = "run_attempts"

    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    n: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    ray_job_id: Mapped[str] = mapped_column(String(64))
    status: Mapped[str] = mapped_column(String(16))
    submitted_at: Mapped[datetime | None]
    started_at: Mapped[datetime | None]
    ended_at: Mapped[datetime | None]
    failure: Mapped[dict[str, Any] | None]
    resumed_from_step: Mapped[int | None] = mapped_column(BigInteger)


class MetricKey(Base):
    """One metric key of one run: its integer id (what points and tiers are keyed by: narrow
    indexes, and no foreign key of their own to check per row) and its value at its newest step,
    kept at ingest, so a run's keys and latest values cost one row per key. ``first_step``
    bounds its history. Ids are never reused (SQLite ``AUTOINCREMENT``, a PostgreSQL sequence),
    so rows left by a deleted run can never be read as another's."""

    __tablename__ = "metric_keys"
    __table_args__ = (
        UniqueConstraint("run_id", "key", name="uq_metric_keys_run_key"),
        {"sqlite_autoincrement": True},
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    key: Mapped[str] = mapped_column(String(200))
    first_step: Mapped[int] = mapped_column(BigInteger)
    step: Mapped[int] = mapped_column(BigInteger)
    value: Mapped[float | None] = mapped_column(Float)


class MetricPoint(Base):
    """One metric value at one step of one key (``MetricKey.id``). ``value`` NULL means NaN
    (SQLite cannot store NaN); ``log_offset`` is where the line that carried it ends in the job
    log (the replay cursor, read by run). No foreign key: ingest writes points only for keys it
    has just looked up in the same transaction."""

    __tablename__ = "metric_points"

    key_id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    step: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    value: Mapped[float | None] = mapped_column(Float)
    log_offset: Mapped[int] = mapped_column(BigInteger)
    run_id: Mapped[str] = mapped_column(String(40))

    # On SQLite the rows live in their primary key's b-tree (no rowid copy): a key's history is
    # one range read, and each point is stored once.
    __table_args__ = (
        Index("ix_metric_points_run_offset", "run_id", "log_offset"),
        {"sqlite_with_rowid": False},
    )


class MetricBucket(Base):
    """One key's points in steps ``[bucket * 2**level, (bucket + 1) * 2**level)``, summarised at
    ingest (count, min and max ignoring NaN, the last step and its value): history tiers that let
    a downsampled read of a long run cost about what its answer costs. Keyed like the points."""

    __tablename__ = "metric_buckets"
    __table_args__ = ({"sqlite_with_rowid": False},)

    key_id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    level: Mapped[int] = mapped_column(SmallInteger, primary_key=True)
    bucket: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    count: Mapped[int] = mapped_column(Integer)
    min: Mapped[float | None] = mapped_column(Float)
    max: Mapped[float | None] = mapped_column(Float)
    last_step: Mapped[int] = mapped_column(BigInteger)
    last_value: Mapped[float | None] = mapped_column(Float)


class RunLog(Base):
    """How far the service has read a run's job log, and which replica holds its follower."""

    __tablename__ = "run_logs"

    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    # Characters of the job log consumed so far (always at a line end until the final read).
    log_offset: Mapped[int] = mapped_column(BigInteger, default=0)
    # Where the current attempt's job log starts in the kept copy (0 for the first attempt):
    # the job's own offset is ``log_offset - log_base``.
    log_base: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    lease_owner: Mapped[str | None] = mapped_column(String(120))
    lease_expires_at: Mapped[datetime | None]
    last_step: Mapped[int | None] = mapped_column(BigInteger)
    last_step_at: Mapped[datetime | None]
    # Set after the final read of a terminal run: nothing more will come.
    finished_at: Mapped[datetime | None]
    # What ingest stored for the run: distinct metric keys and points (checked against the
    # per-run limits without counting the points).
    metric_keys: Mapped[int] = mapped_column(default=0, server_default="0")
    metric_points: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    # The run's rollout samples held (``RunSample``), their stored characters, and the sample
    # lines skipped as unreadable (``metrics.samples``).
    samples_kept: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    samples_chars: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    samples_skipped: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")


class RunSample(Base):
    """One rollout sample of a run as the job shipped it (``jobs.samples``): text fields cut to
    a bound (``cut`` names them), ``prompt_id`` the same for the same prompt at every step.
    Pages read newest first by ``id``."""

    __tablename__ = "run_samples"

    id: Mapped[int] = mapped_column(
        BigInteger().with_variant(Integer(), "sqlite"), primary_key=True, autoincrement=True
    )
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    step: Mapped[int] = mapped_column(BigInteger)
    prompt_id: Mapped[str] = mapped_column(String(16))
    score: Mapped[float] = mapped_column(Float)
    input: Mapped[str] = mapped_column(SafeText)
    output: Mapped[str] = mapped_column(SafeText)
    gts: Mapped[str] = mapped_column(SafeText)
    extras: Mapped[dict[str, Any]] = mapped_column(JSONDoc)
    cut: Mapped[str] = mapped_column(String(400), default="")
    # How many samples the job's file held for this step (all kept when it equals the rows).
    of: Mapped[int | None] = mapped_column(Integer)
    chars: Mapped[int] = mapped_column(Integer)

    # A page newest first filtered by score reads the score from the index; a step's page and
    # the per-step scores (count, mean, min, max, ``of``) read the second index alone.
    __table_args__ = (
        Index("ix_run_samples_run_id_score", "run_id", "id", "score"),
        Index("ix_run_samples_run_step_scores", "run_id", "step", "id", "score", "of"),
        Index("ix_run_samples_run_prompt", "run_id", "prompt_id", "id"),
    )


# The text filter's trigram indexes on ``run_samples.input`` and ``.output``: PostgreSQL only,
# and only where pg_trgm could be created (migration 0029), so not in the model.
TEXT_SEARCH_INDEXES = frozenset({"ix_run_samples_input_trgm", "ix_run_samples_output_trgm"})


class RunSampleStep(Base):
    """What a run holds of one step's samples, kept by the ingest in the transaction that stores
    (or thins) them: the per-step scores are a read of a row a step, not of every sample."""

    __tablename__ = "run_sample_steps"

    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    step: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    count: Mapped[int] = mapped_column(Integer)
    score_sum: Mapped[float] = mapped_column(Float)
    min_score: Mapped[float] = mapped_column(Float)
    max_score: Mapped[float] = mapped_column(Float)
    # The largest ``of`` of the step's samples (how many the job's file held).
    of: Mapped[int | None] = mapped_column(Integer)


class LogChunk(Base):
    """The service's own bounded copy of a job log, in the pieces it was read in."""

    __tablename__ = "log_chunks"

    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    start_offset: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    text: Mapped[str] = mapped_column(SafeText)


class ApiToken(Base):
    """An API token of one user in one team; only its SHA-256 is kept (shown once at creation)."""

    __tablename__ = "api_tokens"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    user: Mapped[str] = mapped_column(String(200))
    team: Mapped[str] = mapped_column(String(64))
    role: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    created_by: Mapped[str | None] = mapped_column(String(200))
    revoked_at: Mapped[datetime | None]


class AuditEntry(Base):
    """One state-changing call: who (user, team, token), what, on which run, when, from where."""

    __tablename__ = "audit"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    at: Mapped[datetime] = mapped_column(default=utcnow, index=True)
    user: Mapped[str] = mapped_column(String(200))
    team: Mapped[str | None] = mapped_column(String(64))
    role: Mapped[str] = mapped_column(String(16))
    token_id: Mapped[str | None] = mapped_column(String(40))
    action: Mapped[str] = mapped_column(String(64))
    run_id: Mapped[str | None] = mapped_column(String(40), index=True)
    target: Mapped[str | None] = mapped_column(String(200))
    client: Mapped[str | None] = mapped_column(String(100))


class Baseline(Base):
    """The run a team's runs of one recipe are measured against (one per team and recipe)."""

    __tablename__ = "baselines"

    team: Mapped[str] = mapped_column(String(64), primary_key=True)
    recipe: Mapped[str] = mapped_column(String(64), primary_key=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    pinned_by: Mapped[str] = mapped_column(String(200))
    pinned_at: Mapped[datetime] = mapped_column(default=utcnow)


class Webhook(Base):
    """A subscription: which runs' events go to which URL, in which format, signed how."""

    __tablename__ = "webhooks"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    # The team whose runs it hears of; None: every team's (an admin's subscription).
    team: Mapped[str | None] = mapped_column(String(64), index=True)
    created_by: Mapped[str] = mapped_column(String(200))
    url: Mapped[str] = mapped_column(String(2000))
    # {"events": [...], "statuses": [...], "recipe": ..., "name_pattern": ...}
    rules: Mapped[dict[str, Any]]
    format: Mapped[str] = mapped_column(String(16), default="standard")
    # Standard Webhooks secrets (``whsec_...``); the previous one also signs until it lapses.
    secret: Mapped[str] = mapped_column(String(100))
    previous_secret: Mapped[str | None] = mapped_column(String(100))
    previous_until: Mapped[datetime | None]
    paused_at: Mapped[datetime | None]
    paused_reason: Mapped[str | None] = mapped_column(SafeText)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class WebhookDelivery(Base):
    """One message for one subscription (the outbox): written in the event's transaction, sent
    by a replica's notifier, its id the stable ``webhook-id`` a receiver de-duplicates by."""

    __tablename__ = "webhook_deliveries"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    webhook_id: Mapped[str] = mapped_column(
        ForeignKey("webhooks.id", ondelete="CASCADE"), index=True
    )
    event_type: Mapped[str] = mapped_column(String(32))
    run_id: Mapped[str | None] = mapped_column(String(40))
    payload: Mapped[dict[str, Any]]
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    # pending -> delivered | failed (given up after the retry window)
    state: Mapped[str] = mapped_column(String(16), default="pending")
    next_attempt_at: Mapped[datetime] = mapped_column(default=utcnow)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    claim_owner: Mapped[str | None] = mapped_column(String(120))
    claim_expires_at: Mapped[datetime | None]
    delivered_at: Mapped[datetime | None]

    __table_args__ = (Index("ix_webhook_deliveries_due", "state", "next_attempt_at"),)


class WebhookAttempt(Base):
    """One try at sending a delivery: the answer's status, how long it took, or the error."""

    __tablename__ = "webhook_attempts"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    delivery_id: Mapped[str] = mapped_column(
        ForeignKey("webhook_deliveries.id", ondelete="CASCADE"), index=True
    )
    at: Mapped[datetime] = mapped_column(default=utcnow)
    status_code: Mapped[int | None] = mapped_column(Integer)
    latency_ms: Mapped[float | None] = mapped_column(Float)
    error: Mapped[str | None] = mapped_column(SafeText)


class WebhookThreshold(Base):
    """Where one ``metric.threshold`` rule of one subscription stands on one run: how many
    consecutive steps (up to ``last_step``) met it, and whether it has fired for this crossing
    (it re-arms when a step no longer meets it)."""

    __tablename__ = "webhook_thresholds"

    webhook_id: Mapped[str] = mapped_column(
        ForeignKey("webhooks.id", ondelete="CASCADE"), primary_key=True
    )
    run_id: Mapped[str] = mapped_column(
        ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True, index=True
    )
    # The rule as ``key op value for N`` (its identity: a changed rule starts afresh).
    rule: Mapped[str] = mapped_column(String(300), primary_key=True)
    streak: Mapped[int] = mapped_column(Integer, default=0)
    last_step: Mapped[int] = mapped_column(BigInteger)
    fired: Mapped[bool] = mapped_column(default=False)


class UsageTotal(Base):
    """Accelerator-seconds allocated in one UTC day (``period`` "d") or month ("m", from its
    first day), per team, user, recipe and accelerator: added when a run ends (its allocation
    from submission to end, split at midnights). Months let a year's report read 12 rows per
    group instead of 365."""

    __tablename__ = "usage_totals"

    period: Mapped[str] = mapped_column(String(1), primary_key=True)
    start: Mapped[date] = mapped_column(Date, primary_key=True)
    team: Mapped[str] = mapped_column(String(64), primary_key=True)
    user: Mapped[str] = mapped_column(String(200), primary_key=True)
    recipe: Mapped[str] = mapped_column(String(64), primary_key=True)
    accelerator: Mapped[str] = mapped_column(String(8), primary_key=True)
    accelerator_seconds: Mapped[float] = mapped_column(Float, default=0.0)
    runs: Mapped[int] = mapped_column(Integer, default=0)


class UsageTeamTotal(Base):
    """``UsageTotal`` summed over users and recipes: one row per period, team and accelerator,
    kept alongside it by the same ``accrue``, so reports by team, day or accelerator read 15
    times fewer rows (5 users x 3 recipes a team in the benchmark)."""

    __tablename__ = "usage_team_totals"

    period: Mapped[str] = mapped_column(String(1), primary_key=True)
    start: Mapped[date] = mapped_column(Date, primary_key=True)
    team: Mapped[str] = mapped_column(String(64), primary_key=True)
    accelerator: Mapped[str] = mapped_column(String(8), primary_key=True)
    accelerator_seconds: Mapped[float] = mapped_column(Float, default=0.0)
    runs: Mapped[int] = mapped_column(Integer, default=0)


class SecretGrant(Base):
    """A run's one-time claim on its secrets: only the token's SHA-256 is kept; redeemed once,
    before it expires, by the job submitted as ``submission_id``, while the run is active."""

    __tablename__ = "secret_grants"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    submission_id: Mapped[str] = mapped_column(String(64))
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    expires_at: Mapped[datetime]
    redeemed_at: Mapped[datetime | None]
