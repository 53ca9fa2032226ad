"""The service's own figures for Prometheus, kept with ``prometheus_client``: one registry per
app, histograms of request latency and of each background loop's tick, and a collector that
reads the current counts (runs by status, follower, loops, streams, accelerator-seconds by team)
when ``/metrics`` is read.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from sqlalchemy import func, select
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service import usage
from service.metrics import startup
from service.operations import accept
from service.store.models import Run
from service.store.status import RunStatus

if TYPE_CHECKING:
    from service.api.deps import Services

# Seconds: from a cached read (a millisecond) to a slow submit or a tick that waits on Ray.
BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class Telemetry:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Histogram(
            "rlrun_http_request_duration_seconds",
            "Time from a request's arrival to its response's start, by route template.",
            ["method", "route", "status"],
            buckets=BUCKETS,
            registry=self.registry,
        )
        self.ticks = Histogram(
            "rlrun_loop_tick_duration_seconds",
            "Time one tick of a background loop took (failed or not).",
            ["loop"],
            buckets=BUCKETS,
            registry=self.registry,
        )
        self._current = _Current()
        self.registry.register(self._current)

    def watch_door(self, state: Callable[[], tuple[float, int, float]]) -> None:
        """Read the door's state at scrape time: how many it lets in now, how many are in, and
        the event loop's smoothed lag (``service.api.overload``)."""
        self._current.door = state

    def watch(self, services: Services) -> None:
        """Read the current counts from ``services`` and time its loops' ticks."""
        self._current.services = services
        for name, loop in services.loops.items():
            loop.on_tick = self.ticks.labels(name).observe

    def text(self) -> bytes:
        return generate_latest(self.registry)


class _Current(Collector):
    """Counts read at scrape time (the database's runs by status, this replica's state)."""

    services: Services | None = None
    door: Callable[[], tuple[float, int, float]] | None = None

    def collect(self) -> Iterator[Metric]:
        if self.door is not None:
            limit, inside, lag = self.door()
            yield GaugeMetricFamily(
                "rlrun_requests_let_in",
                "Requests the door lets into the app at a time now (fewer while the event loop "
                "lags or answers are slow).",
                limit,
            )
            yield GaugeMetricFamily("rlrun_requests_in", "Requests in the app now.", inside)
            yield GaugeMetricFamily(
                "rlrun_event_loop_lag_seconds", "The event loop's timer lag, smoothed.", lag
            )
        services = self.services
        if services is None:
            return
        with services.db.read() as session:
            rows = session.execute(select(Run.status, func.count()).group_by(Run.status))
            counts = {status: count for status, count in rows.tuples()}
            used = usage.lifetime(session)
            started = session.execute(
                select(Run.created_at, Run.startup).where(Run.startup.is_not(None))
            ).all()
        runs = GaugeMetricFamily("rlrun_runs", "Runs by status.", labels=["status"])
        for status in RunStatus:
            runs.add_metric([status.value], counts.get(status.value, 0))
        yield runs
        # Labelled by team and accelerator only (not user or recipe), to keep the series few.
        seconds = CounterMetricFamily(
            "rlrun_accelerator_seconds",
            "Accelerator-seconds allocated to runs (submitted to ended; running runs up to now).",
            labels=["team", "accelerator"],
        )
        for (team, kind), value in sorted(used.items()):
            seconds.add_metric([team, kind], value)
        yield seconds
        yield first_steps(startup.first_step_seconds(at, marks) for at, marks in started)
        follower = services.follower
        if follower is not None:
            now = time.time()
            lag = max((now - t for t in follower.last_read.values()), default=0.0)
            yield CounterMetricFamily(
                "rlrun_metric_points_ingested",
                "Metric points this replica stored.",
                follower.points_ingested,
            )
            yield GaugeMetricFamily(
                "rlrun_followed_runs",
                "Runs whose log this replica follows.",
                len(follower.last_read),
            )
            yield GaugeMetricFamily(
                "rlrun_follower_lag_seconds",
                "Longest time since a followed run's log was read.",
                lag,
            )
        ticks = CounterMetricFamily(
            "rlrun_loop_ticks", "Ticks each background loop ran, failed or not.", labels=["loop"]
        )
        for name, loop in services.loops.items():
            ticks.add_metric([name], loop.ticks)
        yield ticks
        accepts = accept.accepts_of(services.db)
        yield CounterMetricFamily(
            "rlrun_accepts_written",
            "Accepts this replica took to a write (stored, or refused there: a team's limit).",
            accepts.items,
        )
        yield CounterMetricFamily(
            "rlrun_accept_transactions",
            "Transactions that wrote them: accepts that arrive while one commits go together.",
            accepts.batches,
        )
        yield GaugeMetricFamily(
            "rlrun_event_streams",
            "Runs with live event subscribers on this replica.",
            services.broker.upstreams,
        )


# Seconds from acceptance to the first training step: a laptop's minute to an hour at scale.
FIRST_STEP_BUCKETS = (30.0, 60.0, 120.0, 300.0, 600.0, 900.0, 1200.0, 1800.0, 2700.0, 3600.0)


def first_steps(values: Iterable[float | None]) -> HistogramMetricFamily:
    """The histogram of every run's time to its first step (the database's, not this replica's
    own: each replica answers the same)."""
    seen = sorted(v for v in values if v is not None)
    buckets = [(str(b), sum(1 for v in seen if v <= b)) for b in FIRST_STEP_BUCKETS]
    buckets.append(("+Inf", len(seen)))
    family = HistogramMetricFamily(
        "rlrun_time_to_first_step_seconds",
        "Seconds from a run's acceptance to its first training step (queue and start-up).",
    )
    family.add_metric([], buckets, sum(seen))
    return family


class TimeRequests:
    """ASGI middleware: each HTTP request's time to its response start, into ``requests``
    (labelled by the matched route's template, so ids do not make new series)."""

    def __init__(self, app: ASGIApp, telemetry: Telemetry) -> None:
        self.app = app
        self.requests = telemetry.requests

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()

        async def timed(message: Message) -> None:
            if message["type"] == "http.response.start":
                route = getattr(scope.get("route"), "path", None) or "unmatched"
                labels = (scope["method"], route, str(message["status"]))
                self.requests.labels(*labels).observe(time.perf_counter() - started)
            await send(message)

        await self.app(scope, receive, timed)
