"""Ray's own word on what died under a run's job, from its state API: the job's dead actors
(with their death causes) and the nodes they were on that died. Read when a failed run's log is
read to the end, outside any transaction, as lines the classifier reads after the log."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from service.cluster.ray_jobs import RayJobs

PREFIX = "Ray's state API: "
MAX_LINES = 20


def read(ray: RayJobs, run_id: str) -> list[str]:
    """The lines for ``run_id``'s job: a line per dead node that held one of its actors, then a
    line per dead actor of the job; none when Ray no longer knows the job."""
    info = ray.get(run_id)
    if info is None or not info.job_id:
        return []
    actors = ray.state("actors", "DEAD", job_id=info.job_id)
    on = {a.get("node_id") for a in actors if a.get("node_id")}
    nodes = [n for n in ray.state("nodes", "DEAD") if n.get("node_id") in on]
    lines = [
        f"{PREFIX}node {n.get('node_ip') or n.get('node_id')} died: "
        f"{n.get('state_message') or 'no reason given'}"
        for n in nodes
    ]
    for actor in actors:
        why = "; ".join(dict.fromkeys(_messages(actor.get("death_cause"))))
        if why:
            lines.append(f"{PREFIX}actor {actor.get('class_name') or 'actor'} died: {why}")
    return [line[:1000] for line in lines[:MAX_LINES]]


def _messages(cause: Any) -> Iterator[str]:
    """Every ``error_message`` in a death cause, however Ray nests it (creation task failure,
    the actor died, out of memory, runtime env, unschedulable)."""
    if isinstance(cause, dict):
        for key, value in cause.items():
            if key == "error_message" and isinstance(value, str) and value.strip():
                yield " ".join(value.split())
            else:
                yield from _messages(value)
    elif isinstance(cause, list):
        for item in cause:
            yield from _messages(item)
