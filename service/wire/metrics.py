"""What a run's metrics tell, as the API answers it: the series and newest values of its keys,
where its step's time goes (``GET /runs/{id}/step-time``), and its rollout samples."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from service.wire.documents import attributes

# Series and newest values


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
