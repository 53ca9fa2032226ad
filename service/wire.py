"""The API's answers, in one place: the response models (what the OpenAPI document shows and
``service.client`` reads answers into), the builders of the documents that need no domain
module (a run's, which does, is built in ``operations/run_docs.py``), and the one JSON encoding
of every answer and streamed event.

Routes send the documents as they are (``service.api.json_answer``), without validating them
again; a document is built from a ``Run`` or from a row with the same columns. No database or
server imports, so the client stays light; no domain module, so every floor may answer.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import date, datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic_core import to_json

from service.metrics.keys import REWARD_KEY, STEP_KEY


def encode(doc: Any) -> bytes:
    """The one JSON encoding of every answer and streamed event (pydantic-core's serializer):
    datetimes in ISO 8601 with ``Z``; JSON has no NaN/inf, so they travel as the strings
    "NaN", "Infinity", "-Infinity"."""
    return to_json(doc, inf_nan_mode="strings")


# Runs


class EventOut(BaseModel):
    id: int
    at: datetime
    from_status: str | None
    to_status: str
    reason: str
    attempt: int = Field(1, description="the run's attempt when it happened")
    kind: str | None = Field(
        None,
        description='what else it is (null: a change of status or a note): "checkpoint" (a '
        'complete save), "stop_requested" (a stop at the next checkpoint)',
    )
    step: int | None = Field(None, description="the step a checkpoint saved")


class RayOut(BaseModel):
    submission_id: str
    status: str | None
    message: str | None
    error_type: str | None
    exit_code: int | None


class ProgressOut(BaseModel):
    """``step`` is the parameter version (weight syncs) of ``total_steps`` planned syncs."""

    step: int | None = None
    total_steps: int | None = None
    trainer_step: int | None = None
    # The metric ``step`` is read from: verl's fully async current_param_version, or the V1
    # trainer's training/global_step (one weight sync a trainer step).
    key: str = STEP_KEY


class MetricsOut(BaseModel):
    """Key -> value at the newest step it was logged (NaN/inf as "NaN"/"Infinity" strings)."""

    step: int | None = None
    latest: dict[str, float | str] = {}


class HealthOut(BaseModel):
    status: str
    reason: str | None


class DifferenceOut(BaseModel):
    """A run's newest value of a key, the baseline's at the same step (its newest point at or
    before it) and the run's less the baseline's."""

    step: int
    value: float
    baseline_step: int
    baseline_value: float
    difference: float


class BaselineDiffOut(BaseModel):
    """The run's team's and recipe's baseline and the run's difference from it (null where
    either has not logged the key; none for the baseline itself)."""

    run_id: str
    is_baseline: bool
    reward: DifferenceOut | None = None
    response_length: DifferenceOut | None = None
    step_time: DifferenceOut | None = None


class BaselineOut(BaseModel):
    team: str
    recipe: str
    run_id: str
    pinned_by: str
    pinned_at: datetime


class RunSummary(BaseModel):
    id: str
    name: str
    recipe: str
    team: str
    priority: str
    status: str
    health: HealthOut
    queue_reason: str | None = None
    cluster: str | None = Field(None, description="where it was admitted (null: not yet)")
    progress: ProgressOut = ProgressOut()
    reward: float | str | None = None
    created_at: datetime
    submitted_at: datetime | None
    started_at: datetime | None
    ended_at: datetime | None
    links: dict[str, str]
    baseline: BaselineDiffOut | None = Field(
        None, description="its difference from the baseline of its team and recipe, if pinned"
    )


class EvidenceOut(BaseModel):
    offset: int | None = Field(description="of the line in the kept log (null: Ray's message)")
    line: str


class FailureOut(BaseModel):
    class_: str = Field(alias="class", description="npu_oom, host_oom, collective_timeout, ...")
    summary: str
    hint: str
    evidence: list[EvidenceOut]

    model_config = ConfigDict(populate_by_name=True, serialize_by_alias=True)


class RunAttemptOut(BaseModel):
    """One attempt of a run: its own Ray job (``<run id>-a<N>`` for N >= 2)."""

    n: int
    ray_job_id: str
    status: str
    started_at: datetime | None
    ended_at: datetime | None
    failure: FailureOut | None
    resumed_from_step: int | None = Field(
        None, description="the trainer step it resumed from (0: from scratch)"
    )


class BudgetWaitOut(BaseModel):
    """A queued run waits for its team's budget: what the team used this UTC month (running
    runs up to the submitter's last round), of how many accelerator-hours, and by how much it
    is past them. An admin may let the run through (``POST /runs/{id}/admit-over-budget``)."""

    month: str = Field(description="YYYY-MM (UTC)")
    used_hours: float
    budget_hours: float
    over_by_hours: float = Field(description="used_hours - budget_hours, >= 0")
    accelerator: str


class CheckpointOut(BaseModel):
    """The newest complete checkpoint of the current attempt, as its job reported it."""

    step: int
    at: datetime | None


class StopOut(BaseModel):
    """A stop at the next checkpoint: asked for (a cancel with ``at: next_checkpoint``, a
    deadline, a target reached), then made (``saved_step``, ``steps_lost`` once it is)."""

    at: Literal["next_checkpoint"] = "next_checkpoint"
    by: datetime | None = Field(description="when it stops whatever it has saved")
    reason: str | None
    then: str | None = Field(description="how the run ends: STOPPED, or SUCCEEDED (a target)")
    saved_step: int | None = Field(None, description="the checkpoint step it stopped with")
    steps_lost: int | None = Field(
        None, description="steps it had logged past that checkpoint (0: the save came first)"
    )


class RunOut(RunSummary):
    spec: dict[str, Any]
    command: list[str]
    entrypoint: str
    runtime_env: dict[str, Any]
    shape: dict[str, Any]
    warnings: list[str]
    ray: RayOut
    stop_requested: bool
    metrics: MetricsOut
    # The verl launcher's checks on every node before verl started (None until it reports).
    preflight: dict[str, Any] | None = None
    # Why it ended other than SUCCEEDED, once its log is read: class, summary, hint, evidence
    # (the decisive lines with their offsets in the kept log).
    failure: FailureOut | None = None
    # The current attempt (1 until a retry), when a retried run's backoff ends, every attempt.
    attempt: int = 1
    retry_at: datetime | None = None
    attempts: list[RunAttemptOut] = Field(default_factory=list)
    # While it waits for its team's budget (null otherwise), and the admin who let it through.
    budget_wait: BudgetWaitOut | None = None
    over_budget_by: str | None = Field(
        None, description="the admin who let it start although its team is past its budget"
    )
    checkpoint: CheckpointOut | None = None
    stop: StopOut | None = None
    deadline_at: datetime | None = Field(
        None, description="when the current attempt is stopped (admission + max_duration_s)"
    )
    events: list[EventOut]
    # Its start-up, phase by phase (``metrics.startup``), and the seconds from acceptance to
    # its first training step (null before it).
    startup: list[StartupPhaseOut] = Field(default_factory=list)
    time_to_first_step: float | None = None


class StartupPhaseOut(BaseModel):
    """One phase of a run's start-up before its first step. ``start``/``end`` are when the
    service saw it begin and end (its events, or when it read the line); a phase whose trace
    never came is ``seen: false`` with ``note`` "not seen", never guessed. ``source`` names
    what it is read from; ``queued``'s note says why it waited."""

    phase: Literal[
        "queued",
        "runtime_env",
        "preflight",
        "workers_and_model",
        "rollout_engine",
        "first_weight_sync",
        "first_step",
    ]
    start: datetime | None
    end: datetime | None
    seconds: float | None
    seen: bool
    source: str
    note: str | None = None


class RunPage(BaseModel):
    items: list[RunSummary]
    next_cursor: str | None


# Where a step's time goes (``GET /runs/{id}/step-time``)


class StepPartOut(BaseModel):
    """One timed step's seconds: ``wait`` (timing_s/gen: the trainer waiting for samples),
    ``update`` (timing_s/update_actor), ``sync`` (the weight sync), ``other`` the rest."""

    step: int
    total: float
    wait: float
    update: float
    sync: float
    other: float


class SyncTrendOut(BaseModel):
    """The weight sync's seconds over the run (verl #4896): medians of its first and last
    thirds, their ratio, the least-squares slope; ``growing`` when it grew past the rule."""

    points: int
    first_seconds: float
    last_seconds: float
    growth: float | None
    slope_seconds_per_step: float
    growing: bool


class SplitPlanOut(BaseModel):
    feasible_now: bool | None
    feasible_ever: bool | None
    reasons: list[str] = []


class SpecChangeOut(BaseModel):
    """Another split of the run's accelerators, checked by the dry-run planner: ``spec`` is the
    run's spec with ``resources`` moved, ready to submit as a new run."""

    summary: str
    accelerators: int
    from_: str = Field(alias="from")
    to: str
    resources: dict[str, dict[str, Any]]
    spec: dict[str, Any]
    plan: SplitPlanOut
    refused: list[str] = Field([], description="nearer splits the planner refused, and why")


class StepTimeOut(BaseModel):
    """The run's step time split up, the verdict (``rollout-bound``, ``trainer-bound``,
    ``sync-bound``, ``balanced``, or ``unknown`` before a timed step) with the figures behind it
    (medians of shares over the newest steps), the sync's trend and, where it helps, a change of
    split."""

    run_id: str
    trainer: Literal["fully_async", "v1", "unknown"]
    verdict: Literal["rollout-bound", "trainer-bound", "sync-bound", "balanced", "unknown"]
    summary: str
    figures: dict[str, float | None]
    notes: list[str]
    sources: dict[str, str] = Field(
        {}, description="where the idle shares were read from (the keys, or 'not logged')"
    )
    sync_trend: SyncTrendOut | None
    trainer_accelerators: int
    rollout_accelerators: int
    to_rollout: int = Field(description="accelerators to move to the rollout group (-: away)")
    change: SpecChangeOut | None
    steps: list[StepPartOut]


# Metrics


class PointOut(BaseModel):
    step: int
    value: float | str
    min: float | str
    max: float | str


class SeriesOut(BaseModel):
    run_id: str
    series: dict[str, list[PointOut]]


class LatestPointOut(BaseModel):
    step: int
    value: float | str


class LatestOut(BaseModel):
    """Every key a run has logged -> its value at the newest step it was logged."""

    run_id: str
    step: int | None
    latest: dict[str, LatestPointOut]


# Rollout samples


class SampleOut(BaseModel):
    """One rollout sample as the job wrote it (text fields cut at a bound, named in ``cut``)."""

    id: int
    step: int
    prompt_id: str = Field(description="the same for the same prompt at every step")
    score: float
    input: str
    output: str
    gts: str
    extras: dict[str, Any] = Field(description="the reward function's other fields")
    cut: list[str] = Field(description="fields whose text was cut at the bound")
    of: int | None = Field(description="samples the job's file held for this step")


class SampleStepOut(BaseModel):
    step: int
    count: int
    mean: float
    min: float
    max: float
    of: int | None


class SamplesPage(BaseModel):
    run_id: str
    items: list[SampleOut]
    next_cursor: int | None = Field(description="pass back as cursor for the next page")
    kept: int = Field(description="samples the run holds")
    chars: int = Field(description="characters of sample text the run holds")
    skipped: int = Field(description="sample lines skipped as unreadable or past a bound")
    steps: list[SampleStepOut] | None = Field(
        default=None, description="per step held (with steps=true): count and scores"
    )


def sample_doc(row: Any) -> dict[str, Any]:
    """A ``SampleOut`` of a stored sample (``cut``: its comma-separated names, as a list)."""
    return attributes(row, SampleOut.model_fields) | {"cut": [c for c in row.cut.split(",") if c]}


# Recipes


class RecipeOut(BaseModel):
    name: str
    presets: list[str]
    # The JSON Schema of the recipe's run spec: fields, types, defaults, help (a form's source).
    spec_schema: dict[str, Any] = {}


# The cluster


class HolderOut(BaseModel):
    """Who holds what on a node, as Ray's state reports it (the placement groups and actors of
    the holder's job)."""

    kind: str = Field(description="run (of the service) or unmanaged (a job outside it)")
    id: str
    name: str | None = Field(description="the run's name; null for another team's run")
    team: str | None
    resources: dict[str, float]


class NodeOut(BaseModel):
    id: str
    address: str | None = Field(default=None, description="the node's IP, as Ray lists it")
    hostname: str | None = None
    total: dict[str, float]
    available: dict[str, float]
    group: str | None = Field(
        default=None, description="the node group it belongs to (RLRUN_TEAM_NODES), if any"
    )
    holders: list[HolderOut] = Field(default_factory=list)


class UnmanagedJobOut(BaseModel):
    """A job on the cluster that is no run of the service: sent straight to Ray's Jobs API
    (``SUBMISSION``) or a script connected to the cluster (``DRIVER``). Its accelerators count
    as taken in admission."""

    id: str = Field(description="Ray's submission id, or a driver's Ray job id")
    type: str = Field(description="SUBMISSION or DRIVER")
    status: str
    entrypoint: str | None = Field(
        description="the command's head: cut short, control characters and the values of "
        "NAME=value words removed; admins only (null to others)"
    )
    start_time_ms: int | None = Field(description="when Ray started it (ms since the epoch)")
    resources: dict[str, float] = Field(
        description="what it holds in all: its placement groups' bundles and its live actors "
        "outside them (a submission's entrypoint resources among them)"
    )
    nodes: dict[str, dict[str, float]] = Field(description="node id -> what it holds there")


class ClusterOut(BaseModel):
    truncated: bool
    ray: dict[str, bool]
    nodes: list[NodeOut]
    active: list[dict[str, Any]]
    teams: dict[str, dict[str, float | int | None]] = Field(
        description="team -> accelerators it holds, its quota, and its fair share: recent "
        "(accelerators held on average lately, usage decayed with RLRUN_FAIR_SHARE_HALF_LIFE_S), "
        "standing ((recent + held) / quota or the cluster's accelerators) and turn (1: served "
        "first within a priority class); teams that hold or queue something"
    )
    queue: list[dict[str, Any]]
    unmanaged: list[UnmanagedJobOut] = Field(
        description="jobs on the cluster that are no runs of the service"
    )
    team_nodes: dict[str, str] = Field(
        description="team -> node group its runs are placed on ('*': every team not named); "
        "teams not mapped share the nodes of no mapped group"
    )
    job_user: str | None = Field(
        default=None,
        description="the Unix user the embedded cluster's jobs run as, not the service's own",
    )
    jobs_act_as_service: bool = Field(
        default=False,
        description="the embedded cluster's jobs run as the service's own user "
        "(RLRUN_LOCAL_SINGLE_TENANT): any job can read its environment, database and secrets, "
        "and so act as the service",
    )


class ClusterHealthOut(BaseModel):
    up: bool
    since: datetime = Field(description="when it last went up or down (else: the start)")
    failing_since: datetime | None = Field(
        description="the first of the probes failing now (down once they fail for a window)"
    )
    error: str | None = Field(description="the last probe's error (admins only)")


class ClusterInfoOut(BaseModel):
    name: str
    accelerator: str | None = Field(description="NPU or GPU (null: not declared)")
    labels: dict[str, str]
    teams: list[str] | None = Field(description="the teams that may use it (null: every team)")
    quotas: dict[str, int] = Field(description="team -> accelerators it may hold here")
    usable: bool = Field(description="whether the caller's team may use it")
    verl_versions: list[str] = Field(description="the verl releases it runs (empty: any)")
    image: str | None
    data_roots: list[str]
    checkpoint_root: str | None
    local: bool = Field(description="an embedded head the service started")
    address: str | None = Field(description="its Ray dashboard (admins only)")
    health: ClusterHealthOut
    readable: bool = Field(description="whether its inventory could be read now")
    nodes: int | None
    capacity: dict[str, dict[str, float]] | None = Field(
        description="accelerator -> {total, free} (null: down or unreadable)"
    )
    active_runs: int = Field(description="the service's SUBMITTED and RUNNING runs on it")


class ClustersOut(BaseModel):
    clusters: list[ClusterInfoOut] = Field(description="in declared order, the primary first")


# Admin: API tokens and the audit trail


class TokenOut(BaseModel):
    id: str
    user: str
    team: str
    role: str
    created_at: datetime
    created_by: str | None
    revoked_at: datetime | None


class NewToken(TokenOut):
    token: str = Field(description="the secret: shown this once, only its hash is kept")


class TokenPage(BaseModel):
    items: list[TokenOut]
    next_cursor: str | None


class AuditOut(BaseModel):
    id: int
    at: datetime
    user: str
    team: str | None
    role: str
    token_id: str | None
    action: str
    run_id: str | None
    target: str | None
    client: str | None


class AuditPage(BaseModel):
    items: list[AuditOut]
    next_cursor: int | None


# Who is calling


class WhoAmIOut(BaseModel):
    """The caller as the service sees it (open mode: an anonymous admin)."""

    user: str
    team: str | None
    role: str
    auth: bool = Field(description="whether the service asks for tokens")


# Usage


class UsageOut(BaseModel):
    """A page of a usage report; the totals are the whole report's."""

    start: date
    end: date
    group_by: list[str]
    rows: list[dict[str, Any]]
    total_rows: int = Field(description="rows of the whole report, on every page")
    total_accelerator_hours: float = Field(description="of the whole report, not the page")
    next_cursor: str | None = Field(description="pass back as cursor for the next page")


# Webhooks


# A metric.threshold rule's comparison (``service.notify.thresholds`` evaluates it).
ThresholdOp = Literal["<", "<=", ">", ">="]


class Threshold(BaseModel):
    """Fires when ``key op value`` holds for ``for_steps`` consecutive logged steps."""

    model_config = ConfigDict(extra="forbid")

    key: str = Field(min_length=1, max_length=200, pattern=r"^[^\s:]+$", examples=[REWARD_KEY])
    op: ThresholdOp
    value: float = Field(allow_inf_nan=False)
    for_steps: int = Field(default=1, ge=1, le=1_000_000)


class AttemptOut(BaseModel):
    at: datetime
    status_code: int | None
    latency_ms: float | None
    error: str | None


class WebhookOut(BaseModel):
    id: str
    team: str | None
    url: str = Field(
        description="in full for its maker and admins; others see its host and a masked path"
    )
    format: str
    events: list[str]
    statuses: list[str]
    recipe: str | None
    name_pattern: str | None
    thresholds: list[Threshold]
    created_by: str
    created_at: datetime
    paused_at: datetime | None
    paused_reason: str | None
    last_attempt: AttemptOut | None = Field(
        default=None, description="its newest try at sending anything (null: none yet)"
    )
    failures: int = Field(
        default=0, description="tries failed since its last 2xx answer (all, when none had one)"
    )


class NewSecret(BaseModel):
    secret: str = Field(description="shown this once: verify signatures with it")
    previous_valid_until: datetime | None = None


class NewWebhook(WebhookOut, NewSecret):
    pass


class DeliveryOut(BaseModel):
    id: str = Field(description="the webhook-id header: the same on every attempt")
    event_type: str
    run_id: str | None
    state: str
    created_at: datetime
    next_attempt_at: datetime
    delivered_at: datetime | None
    attempts: list[AttemptOut]


# Documents built from rows


def attributes(row: Any, names: Iterable[str]) -> dict[str, Any]:
    """The ``names`` of a row (a model's, or a result row with those columns), as a document."""
    return {name: getattr(row, name) for name in names}


def event_doc(event: Any) -> dict[str, Any]:
    """A status event (a ``RunEvent`` or a row with its columns), in a run and on its stream."""
    columns = ("id", "at", "from_status", "to_status", "reason", "kind", "step")
    return {**attributes(event, columns), "attempt": event.attempt or 1}


def token_out(row: Any) -> dict[str, Any]:
    """A ``TokenOut`` of an ``ApiToken``."""
    return attributes(row, TokenOut.model_fields)
