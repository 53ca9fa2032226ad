"""``GET /metrics``: Prometheus text for runs by status, ingested points and follower lag."""

from __future__ import annotations

import time

from fastapi import APIRouter
from fastapi.responses import PlainTextResponse
from sqlalchemy import func, select

from service.api.deps import ServicesDep
from service.store.models import Run
from service.store.status import RunStatus

router = APIRouter(tags=["health"])


@router.get("/metrics", response_class=PlainTextResponse)
def prometheus(services: ServicesDep) -> str:
    with services.db.read() as session:
        rows = session.execute(select(Run.status, func.count()).group_by(Run.status)).tuples()
        counts = {status: count for status, count in rows}
    out = ["# HELP rlrun_runs Runs by status.", "# TYPE rlrun_runs gauge"]
    out += [f'rlrun_runs{{status="{s.value}"}} {counts.get(s.value, 0)}' for s in RunStatus]
    follower = services.follower
    if follower is not None:
        now = time.time()
        lag = max((now - t for t in follower.last_read.values()), default=0.0)
        out += [
            "# HELP rlrun_metric_points_ingested_total Metric points this replica stored.",
            "# TYPE rlrun_metric_points_ingested_total counter",
            f"rlrun_metric_points_ingested_total {follower.points_ingested}",
            "# HELP rlrun_followed_runs Runs whose log this replica follows.",
            "# TYPE rlrun_followed_runs gauge",
            f"rlrun_followed_runs {len(follower.last_read)}",
            "# HELP rlrun_follower_lag_seconds Longest time since a followed run's log was read.",
            "# TYPE rlrun_follower_lag_seconds gauge",
            f"rlrun_follower_lag_seconds {lag:.3f}",
        ]
    out += [
        "# HELP rlrun_loop_ticks_total Ticks each background loop has run (failed or not).",
        "# TYPE rlrun_loop_ticks_total counter",
        *(
            f'rlrun_loop_ticks_total{{loop="{n}"}} {loop.ticks}'
            for n, loop in services.loops.items()
        ),
        "# HELP rlrun_event_streams Runs with live event subscribers on this replica.",
        "# TYPE rlrun_event_streams gauge",
        f"rlrun_event_streams {services.broker.upstreams}",
    ]
    return "\n".join(out) + "\n"
