"""``GET /cluster``: nodes, what each active run holds, teams against quotas, the queue in order."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query

from service.api.auth import Viewer
from service.api.deps import ServicesDep
from service.operations.cluster_view import cluster_view
from service.wire import ClusterOut

router = APIRouter(tags=["cluster"])


@router.get("/cluster", response_model=ClusterOut)
def get_cluster(
    services: ServicesDep,
    principal: Viewer,
    limit: Annotated[
        int | None, Query(ge=1, le=100_000, description="rows of active and queue at most")
    ] = None,
) -> dict[str, Any]:
    """The queue in admission's order; each reason is the one the submitter stored with the run
    (``queue_reason``; null until a round has considered it). Nothing is decided here.
    Another team's runs show without their names to a non-admin; ``active`` and ``queue`` are
    cut at ``limit`` rows (at most the configured bound), ``truncated`` says when.
    ``unmanaged``: the jobs on the cluster that are no runs of the service, their commands
    shown to admins only."""
    return cluster_view(services, principal, limit)
