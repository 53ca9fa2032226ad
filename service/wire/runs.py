"""A run as the API answers it: its summary and whole document, attempts, failure, checkpoint,
stop, start-up phases and baseline, a page of runs, and its status events' documents (the run's
own is built in ``operations/run_docs.py``)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from service.metrics.keys import STEP_KEY
from service.wire.documents import STORED, attributes


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
    """A run in a page of runs. The fields marked ``STORED`` are the run's columns as stored
    (``wire.documents.STORED``); ``operations.run_docs.summary_doc`` makes the others."""

    id: Annotated[str, STORED]
    name: Annotated[str, STORED]
    recipe: Annotated[str, STORED]
    team: Annotated[str, STORED]
    priority: str
    status: Annotated[str, STORED]
    health: HealthOut
    queue_reason: str | None = None
    cluster: Annotated[str | None, STORED] = Field(
        None, description="where it was admitted (null: not yet)"
    )
    progress: ProgressOut = ProgressOut()
    reward: float | str | None = None
    created_at: Annotated[datetime, STORED]
    submitted_at: Annotated[datetime | None, STORED]
    started_at: Annotated[datetime | None, STORED]
    ended_at: Annotated[datetime | None, STORED]
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
    """A run's whole document (``GET /runs/{id}``): a new field that is a column shown as stored
    is this one declaration, marked ``STORED``; ``operations.run_docs.run_doc`` makes the
    others, and ``tests/test_answer_contracts.py`` holds it to this model."""

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
    preflight: Annotated[dict[str, Any] | None, STORED] = None
    # Why it ended other than SUCCEEDED, once its log is read: class, summary, hint, evidence
    # (the decisive lines with their offsets in the kept log).
    failure: Annotated[FailureOut | None, STORED] = None
    # The current attempt (1 until a retry), when a retried run's backoff ends, every attempt.
    attempt: int = 1
    retry_at: Annotated[datetime | None, STORED] = None
    attempts: list[RunAttemptOut] = Field(default_factory=list)
    # While it waits for its team's budget (null otherwise), and the admin who let it through.
    budget_wait: BudgetWaitOut | None = None
    over_budget_by: Annotated[str | None, STORED] = Field(
        None, description="the admin who let it start although its team is past its budget"
    )
    checkpoint: CheckpointOut | None = None
    stop: StopOut | None = None
    deadline_at: Annotated[datetime | None, STORED] = Field(
        None, description="when the current attempt is stopped (admission + max_duration_s)"
    )
    events: list[EventOut]
    # Its start-up, phase by phase (``metrics.startup``), and the seconds from acceptance to
    # its first training step (null before it).
    startup: list[StartupPhaseOut] = Field(default_factory=list)
    time_to_first_step: float | None = None
    # The current attempt's weight syncs as their digests proved them (null: none reported).
    weight_sync: WeightSyncOut | None = None


class WeightSyncOut(BaseModel):
    """The current attempt's weight syncs, proven by a digest on each side: the trainer's of
    what it sent for a version and a rollout's of what its model loaded. ``waiting``: versions
    sent that no rollout has reported yet; ``problem``: why a sync is not proven (health
    ``weights_unsynced``)."""

    proven: int = Field(description="versions whose digest a rollout reported")
    last_version: int | None = None
    last_digest: str | None = Field(None, description="SHA-256 of the newest proven version")
    waiting: list[int] = Field(default_factory=list)
    problem: str | None = None


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


def event_doc(event: Any) -> dict[str, Any]:
    """A status event (a ``RunEvent`` or a row with its columns), in a run and on its stream."""
    columns = ("id", "at", "from_status", "to_status", "reason", "kind", "step")
    return {**attributes(event, columns), "attempt": event.attempt or 1}
