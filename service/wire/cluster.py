"""What there is to run and where, as the API answers it: the recipes, the cluster's nodes,
holders, unmanaged jobs, queue and teams, and the declared clusters with their health."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field

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
