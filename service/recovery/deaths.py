"""Ray's own word on what died under a run's job, from its state API: the job's dead actors
(with their death causes) and the nodes they were on that died. Read when a failed run's log is
read to the end, outside any transaction, as lines the classifier reads after the log. On the
service's own host (the embedded cluster) the kernel's log is read too, for an OOM kill of a
dead actor's process (``recovery.kernel``): Ray words a worker the kernel killed as one that
exited with no error of its own.

A lost node is not known at once: an actor on it first turns *unavailable* (the job's driver
fails with Ray's ``ActorUnavailableError``), and only Ray's health checks, some 15-30 s later,
call the node dead. Until they have, Ray's word is ``undecided`` and the failure waits for it
(at most ``VERDICT_WAIT``), so a lost node is not taken for an actor that died."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from service.cluster.ray_jobs import RayJobs
from service.recovery import kernel

PREFIX = "Ray's state API: "
MAX_LINES = 20
# Ray's error when it could not reach an actor and cannot yet tell whether it is dead.
UNAVAILABLE = "ActorUnavailableError"
# How long after the job ended an undecided word is waited for: Ray's health checks call a node
# dead after 5 missed checks 3 s apart (its defaults), well within this.
VERDICT_WAIT = timedelta(seconds=45)
# Ray's ``ActorDiedErrorContext.Reason``, by number.
DEATH_REASONS = (
    "UNSPECIFIED",
    "WORKER_DIED",
    "OWNER_DIED",
    "NODE_DIED",
    "RAY_KILL",
    "OUT_OF_SCOPE",
    "REF_DELETED",
)
# The texts of a death cause: its message, the dead node's, the creation task's exception.
_MESSAGES = ("error_message", "reason_message", "formatted_exception_string")


@dataclass(frozen=True)
class Word:
    lines: list[str] = field(default_factory=list)
    # The job ended on an unreachable actor and no node of its actors is dead (yet).
    undecided: bool = False


def read(ray: RayJobs, run_id: str, on_host: bool = False) -> Word:
    """Ray's word on ``run_id``'s job: a line per dead node that held one of its actors, then a
    line per dead actor of the job, then (``on_host``: the nodes are the service's host's) the
    kernel's line on each of those actors' processes it killed for memory; nothing when Ray no
    longer knows the job."""
    info = ray.get(run_id)
    if info is None or not info.job_id:
        return Word()
    actors = ray.state("actors", "DEAD", job_id=info.job_id)
    on = {a.get("node_id") for a in actors if a.get("node_id")}
    nodes = [n for n in ray.state("nodes", "DEAD") if n.get("node_id") in on]
    lines = [
        f"{PREFIX}node {n.get('node_ip') or n.get('node_id')} died: "
        f"{n.get('state_message') or 'no reason given'}"
        for n in nodes
    ]
    for actor in actors:
        cause = actor.get("death_cause")
        why = "; ".join(dict.fromkeys(_messages(cause)))
        if why:
            kind = _kind(cause)
            said = f" ({kind})" if kind else ""
            lines.append(f"{PREFIX}actor {actor.get('class_name') or 'actor'} died{said}: {why}")
    if on_host:  # before the actors' lines, which are cut at MAX_LINES
        pids = {int(a["pid"]) for a in actors if str(a.get("pid") or "").isdigit()}
        lines[len(nodes) : len(nodes)] = kernel.oom_kills(pids)
    undecided = UNAVAILABLE in (info.message or "") and not nodes
    return Word([line[:1000] for line in lines[:MAX_LINES]], undecided)


def _kind(cause: Any) -> str:
    """Ray's word on why the actor died: the death cause's context (``oom_context``,
    ``actor_died_error_context``, ...) and, for an actor that died, the reason (``NODE_DIED``,
    ``WORKER_DIED``, ...; a number where the state API gives Ray's enum as one)."""
    if not isinstance(cause, dict) or len(cause) != 1:
        return ""
    ((context, detail),) = cause.items()
    reason = detail.get("reason") if isinstance(detail, dict) else None
    if isinstance(reason, int) and 0 <= reason < len(DEATH_REASONS):
        reason = DEATH_REASONS[reason]
    return f"{context}, {reason}" if isinstance(reason, str) and reason else str(context)


def _messages(cause: Any) -> Iterator[str]:
    """Every message in a death cause, however Ray nests it (creation task failure, the actor
    died, out of memory, runtime env, unschedulable)."""
    if isinstance(cause, dict):
        for key, value in cause.items():
            if key in _MESSAGES and isinstance(value, str) and value.strip():
                yield " ".join(value.split())
            else:
                yield from _messages(value)
    elif isinstance(cause, list):
        for item in cause:
            yield from _messages(item)
