"""No process of an embedded cluster's job user outlives its job: each round ends the processes
of that user in no node's tree and of no job Ray lists alive, found so two rounds in a row
(``LocalRayCluster.end_strays``),
and records every process ended (there, at the cluster's start and at its stop) in the audit
trail: ``process.ended``, actor the cluster, naming the process, the job its environment names
and its command."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass

from service.cluster.local_ray import LocalRayCluster
from service.cluster.registry import Clusters
from service.store import audit
from service.store.db import Database

log = logging.getLogger(__name__)
ENDED = "process.ended"
LIVE = ("PENDING", "RUNNING")


@dataclass
class StrayProcesses:
    db: Database
    clusters: Clusters

    def tick(self) -> None:
        heads = []
        for handle in self.clusters:
            head = handle.local
            if head is None:
                continue
            heads.append((handle.name, head))
            if head.user is not None and head.running:
                # Ray's own list, read now (before the processes are): the live jobs.
                live = {
                    str(job["submission_id"])
                    for job in handle.ray.all_jobs()
                    if job.get("submission_id") and job.get("status") in LIVE
                }
                head.end_strays(live, confirm=True)
        record(self.db, heads)


def record(db: Database, heads: Iterable[tuple[str, LocalRayCluster]]) -> None:
    """An audit row for each process the ``heads`` (by name) ended and have not told yet."""
    rows = []
    for name, head in heads:
        for stray in head.take_ended():
            user = head.user.name if head.user is not None else "?"
            said = stray.said(user)
            log.warning("cluster %s: ended %s", name, said)
            rows.append(
                audit.entry(
                    user=audit.CLUSTER_USER,
                    role=audit.CLUSTER_ROLE,
                    action=ENDED,
                    run_id=None,
                    target=f"{name}: {said}",
                )
            )
    if not rows:
        return
    with db.transaction() as session:
        for row in rows:
            audit.record(session, row)
