"""What of a run's job waits on Ray and can never start now: its actors pending creation and
placement groups pending (Ray's state API), each demand set against every node's free
resources. Ray reports such a job RUNNING forever (verl issue 7381: a rollout server actor that
cannot be placed); this names the shape that is missing."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from service.cluster.ray_jobs import RayJobs
from service.scheduling.inventory import SHOWN

Resources = Mapping[str, float]


@dataclass(frozen=True)
class Waiting:
    """Ray's state of the cluster's waiting work, read in three calls."""

    job_ids: dict[str, str]  # submission id -> Ray's job id (hex)
    actors: list[dict[str, Any]]
    groups: list[dict[str, Any]]


def read(ray: RayJobs) -> Waiting:
    jobs = {
        str(j["submission_id"]): str(j["job_id"])
        for j in ray.all_jobs()
        if j.get("submission_id") and j.get("job_id")
    }
    actors = [a for a in ray.state("actors", "PENDING_CREATION") if _in(a, "PENDING_CREATION")]
    groups = [g for g in ray.state("placement_groups", "PENDING") if _in(g, "PENDING")]
    return Waiting(jobs, actors, groups)


def missing(waiting: Waiting, submission: str, free: Mapping[str, Resources]) -> str | None:
    """The first demand of the job ``submission`` (a run's current attempt) that no node's free
    resources (``free``: node -> resource -> amount) can hold, said as "an actor of this job
    (Name) needs {NPU: 8} on one node; the largest free is 6"; None when each waiting demand
    fits somewhere."""
    job_id = waiting.job_ids.get(submission)
    if job_id is None:
        return None
    for actor in waiting.actors:
        # An actor in a placement group waits for its group (checked below).
        if actor.get("job_id") == job_id and not actor.get("placement_group_id"):
            name = actor.get("class_name") or actor.get("name") or "actor"
            said = _short(
                f"an actor of this job ({name})", _demand(actor.get("required_resources")), free
            )
            if said:
                return said
    for group in waiting.groups:
        if group.get("creator_job_id") != job_id:
            continue
        bundles = [_demand(b.get("unit_resources")) for b in group.get("bundles") or ()]
        label = group.get("name") or group.get("placement_group_id")
        what = f"a placement group of this job ({label})"
        if group.get("strategy") == "STRICT_PACK":
            said = _short(what + ", all bundles", _sum(bundles), free)
            if said:
                return said
            continue
        for bundle in bundles:
            said = _short(f"{what}, a bundle", bundle, free)
            if said:
                return said
    return None


def _short(what: str, need: dict[str, float], free: Mapping[str, Resources]) -> str | None:
    if not need or any(all(n.get(r, 0.0) >= a for r, a in need.items()) for n in free.values()):
        return None
    # The resource no node has enough of (the first such, in the order Ray lists them).
    short = next(
        (r for r, a in need.items() if all(n.get(r, 0.0) < a for n in free.values())),
        next(iter(need)),
    )
    largest = max((n.get(short, 0.0) for n in free.values()), default=0.0)
    shape = ", ".join(f"{r}: {_num(a)}" for r, a in need.items())
    return f"{what} needs {{{shape}}} on one node; the largest free is {_num(largest)} {short}"


def _demand(resources: Any) -> dict[str, float]:
    """What a demand asks of the resources a node's free amounts are known for."""
    if not isinstance(resources, dict):
        return {}
    return {
        str(r): float(a)
        for r, a in resources.items()
        if r in SHOWN and r != "memory" and isinstance(a, int | float) and a > 0
    }


def _sum(bundles: Iterable[dict[str, float]]) -> dict[str, float]:
    out: dict[str, float] = {}
    for bundle in bundles:
        for r, a in bundle.items():
            out[r] = out.get(r, 0.0) + a
    return out


def _in(row: dict[str, Any], state: str) -> bool:
    return bool(row.get("state", state) == state)


def _num(value: float) -> str:
    return f"{value:g}"
