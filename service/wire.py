"""The API's response models: what the service answers and ``service.client`` reads.

Plain pydantic, no database or server imports, so the client stays light.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class EventOut(BaseModel):
    id: int
    at: datetime
    from_status: str | None
    to_status: str
    reason: str


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


class MetricsOut(BaseModel):
    """Key -> value at the newest step it was logged (NaN/inf as "NaN"/"Infinity" strings)."""

    step: int | None = None
    latest: dict[str, float | str] = {}


class HealthOut(BaseModel):
    status: str
    reason: str | None


class RunSummary(BaseModel):
    id: str
    name: str
    recipe: str
    team: str
    priority: str
    status: str
    health: HealthOut
    queue_reason: str | None = None
    progress: ProgressOut = ProgressOut()
    reward: float | str | None = None
    created_at: datetime
    submitted_at: datetime | None
    started_at: datetime | None
    ended_at: datetime | None
    links: dict[str, str]


class EvidenceOut(BaseModel):
    offset: int | None = Field(description="of the line in the kept log (null: Ray's message)")
    line: str


class FailureOut(BaseModel):
    class_: str = Field(alias="class", description="npu_oom, host_oom, collective_timeout, ...")
    summary: str
    hint: str
    evidence: list[EvidenceOut]

    model_config = ConfigDict(populate_by_name=True, serialize_by_alias=True)


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
    events: list[EventOut]


class RunPage(BaseModel):
    items: list[RunSummary]
    next_cursor: str | None


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


class RecipeOut(BaseModel):
    name: str
    presets: list[str]
    # The JSON Schema of the recipe's run spec: fields, types, defaults, help (a form's source).
    spec_schema: dict[str, Any] = {}


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
    teams: dict[str, dict[str, int | None]]
    queue: list[dict[str, Any]]
    unmanaged: list[UnmanagedJobOut] = Field(
        description="jobs on the cluster that are no runs of the service"
    )
    team_nodes: dict[str, str] = Field(
        description="team -> node group its runs are placed on ('*': every team not named); "
        "teams not mapped share the nodes of no mapped group"
    )
