"""``GET /cluster``: the primary cluster's nodes, what each active run holds, teams against
quotas, the queue in order; ``GET /clusters``: every cluster with its health and capacity."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query

from service.api.auth import Viewer
from service.api.deps import ServicesDep
from service.operations.cluster_view import cluster_view
from service.operations.clusters_view import clusters_view
from service.wire.cluster import ClusterOut, ClustersOut

router = APIRouter(tags=["cluster"])


@router.get("/cluster", response_model=ClusterOut)
def get_cluster(
    services: ServicesDep,
    principal: Viewer,
    limit: Annotated[
        int | None, Query(ge=1, le=100_000, description="rows of active and queue at most")
    ] = None,
) -> dict[str, Any]:
    """The primary cluster (the first of ``GET /clusters``) and the one queue in admission's
    order; each reason is the one the submitter stored with the run
    (``queue_reason``; null until a round has considered it). Nothing is decided here.
    Another team's runs show without their names to a non-admin; ``active`` and ``queue`` are
    cut at ``limit`` rows (at most the configured bound), ``truncated`` says when.
    ``unmanaged``: the jobs on the cluster that are no runs of the service, their commands
    shown to admins only."""
    return cluster_view(services, principal, limit)


@router.get("/clusters", response_model=ClustersOut)
def get_clusters(services: ServicesDep, principal: Viewer) -> dict[str, Any]:
    """Every cluster runs may go to, in declared order: what it is (accelerator, labels, the
    teams that may use it, verl versions, image, roots), whether it is up and since when, its
    capacity per accelerator (total and free, from the cached inventory; null while down) and
    the service's active runs on it. Its address and probe error are shown to admins only."""
    return clusters_view(services, principal)
