"""Jobs on the cluster as Ray's own state shows them, with what each holds on which node.

Ray's job list names every job (``SUBMISSION`` jobs sent to its Jobs API, ``DRIVER`` jobs of
scripts that connected to the cluster directly). What a job holds is read from Ray's state API:
the bundles of its placement groups that are created, and its live actors outside placement
groups (a submission's driver runs in a supervisor actor that holds its entrypoint resources).
Tasks are not counted here; their resources are in Ray's "available" figures all the same.

Which of these jobs are runs of the service is for the caller to say (``unmanaged``): the
database knows, not Ray (a job may carry any metadata). Ray's answers are handed in
(``from_state``); ``cluster/inventory_cache.py`` asks for them.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.recovery.attempts import runs_of_jobs
from service.store.models import Run

# A submission's supervisor actor; it holds the job's entrypoint resources.
SUPERVISOR_PREFIX = "_ray_internal_job_actor_"
ALIVE = {"SUBMISSION": {"PENDING", "RUNNING"}, "DRIVER": {"RUNNING"}}
ENTRYPOINT_CHARS = 160
# `NAME=value` words (env assignments before a command, `env NAME=value ...`): values hidden.
_ASSIGNMENT = re.compile(r"(?<!\S)([A-Za-z_][A-Za-z0-9_]*)=\S*")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]+")


@dataclass(frozen=True)
class ClusterJob:
    id: str  # the submission id, or for a driver that connected directly its Ray job id
    type: str  # SUBMISSION | DRIVER
    status: str
    entrypoint: str  # its head, cleaned (see ``entrypoint_head``)
    start_time_ms: int | None
    # Node id -> resource -> amount held there.
    held: dict[str, dict[str, float]] = field(default_factory=dict)

    def total(self) -> dict[str, float]:
        out: dict[str, float] = defaultdict(float)
        for resources in self.held.values():
            for name, amount in resources.items():
                out[name] += amount
        return dict(out)

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": self.type,
            "status": self.status,
            "entrypoint": self.entrypoint,
            "start_time_ms": self.start_time_ms,
            "resources": self.total(),
            "nodes": self.held,
        }


def entrypoint_head(entrypoint: str | None) -> str:
    """At most ``ENTRYPOINT_CHARS`` of a command, control characters as one space, and no
    value of a ``NAME=value`` word (a secret passed on the command line stays out)."""
    text = _CONTROL.sub(" ", entrypoint or "").strip()
    text = _ASSIGNMENT.sub(r"\1=…", text)
    return text if len(text) <= ENTRYPOINT_CHARS else text[: ENTRYPOINT_CHARS - 1] + "…"


def from_state(
    jobs: Iterable[dict[str, Any]],
    actors: Iterable[dict[str, Any]],
    placement_groups: Iterable[dict[str, Any]],
) -> list[ClusterJob]:
    """The alive jobs of ``GET /api/jobs/`` with what the state API's actors and placement
    groups (``/api/v0/...?detail=true``) say they hold."""
    by_ray_id: dict[str, str] = {}
    alive: list[dict[str, Any]] = []
    for job in jobs:
        kind = str(job.get("type"))
        if job.get("status") not in ALIVE.get(kind, ()):
            continue
        key = job.get("submission_id") if kind == "SUBMISSION" else job.get("job_id")
        if not key:
            continue
        alive.append(job | {"_key": str(key)})
        if job.get("job_id"):
            by_ray_id[str(job["job_id"])] = str(key)
    held: dict[str, dict[str, dict[str, float]]] = defaultdict(lambda: defaultdict(dict))

    def add(owner: str | None, node: str | None, resources: dict[str, Any] | None) -> None:
        if owner is None or not node or not resources:
            return
        slot = held[owner][node]
        for name, amount in resources.items():
            if isinstance(amount, int | float) and amount > 0:
                slot[name] = slot.get(name, 0.0) + float(amount)

    for actor in actors:
        if actor.get("state") == "DEAD" or actor.get("placement_group_id"):
            continue
        name = str(actor.get("name") or "")
        if name.startswith(SUPERVISOR_PREFIX):
            owner: str | None = name[len(SUPERVISOR_PREFIX) :]
        else:
            owner = by_ray_id.get(str(actor.get("job_id")))
        add(owner, actor.get("node_id"), actor.get("required_resources"))
    for group in placement_groups:
        if group.get("state") != "CREATED":
            continue
        owner = by_ray_id.get(str(group.get("creator_job_id")))
        for bundle in group.get("bundles") or ():
            add(owner, bundle.get("node_id"), bundle.get("unit_resources"))
    return [
        ClusterJob(
            id=job["_key"],
            type=str(job["type"]),
            status=str(job["status"]),
            entrypoint=entrypoint_head(job.get("entrypoint")),
            start_time_ms=job.get("start_time") or None,
            held={node: dict(r) for node, r in sorted(held[job["_key"]].items())},
        )
        for job in alive
    ]


def unmanaged(session: Session, jobs: Iterable[ClusterJob]) -> list[ClusterJob]:
    """The jobs that are no run of the service (no run has their submission id)."""
    jobs = list(jobs)
    runs = runs_of_jobs(j.id for j in jobs if j.type == "SUBMISSION")
    ids = set(runs.values())
    known = set(session.scalars(select(Run.id).where(Run.id.in_(ids)))) if ids else set()
    return [j for j in jobs if runs.get(j.id) not in known]


def held_outside(jobs: Iterable[ClusterJob], nodes: set[str] | None = None) -> dict[str, float]:
    """What ``jobs`` hold in all (on ``nodes`` only, when given)."""
    out: dict[str, float] = defaultdict(float)
    for job in jobs:
        for node, resources in job.held.items():
            if nodes is None or node in nodes:
                for name, amount in resources.items():
                    out[name] += amount
    return dict(out)


def holders(
    session: Session, jobs: Iterable[ClusterJob], foreign: Iterable[ClusterJob]
) -> dict[str, list[dict[str, Any]]]:
    """Node id -> who holds what there, as Ray's state reports it: runs of the service (by
    id, name and team) and jobs outside it."""
    outside_ids = {j.id for j in foreign}
    jobs = list(jobs)
    of_run = runs_of_jobs(j.id for j in jobs if j.id not in outside_ids)
    ids = set(of_run.values())
    runs = (
        {
            r.id: r
            for r in session.execute(select(Run.id, Run.name, Run.team).where(Run.id.in_(ids)))
        }
        if ids
        else {}
    )
    out: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for job in jobs:
        run = runs.get(of_run.get(job.id, ""))
        for node, resources in job.held.items():
            out[node].append(
                {
                    "kind": "run" if run else "unmanaged",
                    "id": run.id if run else job.id,
                    "name": run.name if run else None,
                    "team": run.team if run else None,
                    "resources": resources,
                }
            )
    return dict(out)
