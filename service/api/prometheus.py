"""``GET /metrics``: the service's own figures as Prometheus text (see ``service.telemetry``)."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST

from service.api.deps import ServicesDep

router = APIRouter(tags=["health"])


@router.get("/metrics", response_class=Response, responses={200: {"content": {"text/plain": {}}}})
def prometheus(services: ServicesDep, request: Request) -> Response:
    """Runs by status, ingested points and follower lag, loop ticks, live streams, accepts
    written and the transactions that wrote them (``rlrun_accepts_written``,
    ``rlrun_accept_transactions``: accepts that arrive while one commits go together); histograms
    of request latency (``rlrun_http_request_duration_seconds``) and of loop ticks
    (``rlrun_loop_tick_duration_seconds``)."""
    return Response(request.app.state.telemetry.text(), media_type=CONTENT_TYPE_LATEST)
