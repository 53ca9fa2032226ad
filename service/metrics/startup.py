"""A run's start-up, phase by phase, up to its first training step: pure functions over the
marks the follower records (``runs.startup``: mark -> when the service first read its line),
the run's events and its preflight report.

A mark is the time the service read the line (the follower reads every second or so), not a
time verl printed: verl's own lines on this path carry none. A phase whose lines never came
(another recipe, verl's V1 trainer, a run that failed before) is "not seen", never guessed.
Each phase starts no earlier than the one before it ends, so the phases never overlap and add
up to no more than the time to the first step.

| phase | from | to | source |
| --- | --- | --- | --- |
| queued | accepted | submitted to Ray | the service's events (and why it waited) |
| runtime_env | submitted | Ray says RUNNING | the service's events (Ray's job status) |
| preflight | report - its seconds | the report | the launcher's ``rlrun-preflight:`` line |
| workers_and_model | ``Starting create trainer`` | ``FullyAsyncTrainer created ...`` | verl |
| rollout_engine | ``Creating FullyAsyncRollouter`` | ``Rollouter created ...`` | verl |
| first_weight_sync | ``Param sync before fit`` | ``All components initialized`` | verl |
| first_step | ``All components initialized`` | the first ``training/global_step`` line | verl |
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from jobs.verl_launch import HANDOVER
from service.metrics.parse import strip_ray_prefix

# Mark -> the text its line holds (verl 0.9.1's fully async task runner, ``[ASYNC MAIN]``).
LINES = {
    "handover": HANDOVER,
    "trainer_create": "[ASYNC MAIN] Starting create trainer",
    "trainer_ready": "[ASYNC MAIN] FullyAsyncTrainer created and initialized successfully",
    "rollouter_create": "[ASYNC MAIN] Creating FullyAsyncRollouter",
    "rollouter_ready": "[ASYNC MAIN] Rollouter created and initialized successfully",
    "sync_start": "[ASYNC MAIN] Param sync before fit",
    "sync_done": "[ASYNC MAIN] All components initialized successfully",
}
PREFLIGHT, FIRST_STEP = "preflight", "first_step"
# (phase, its start mark, its end mark, the source the docs name)
VERL_PHASES = (
    ("workers_and_model", "trainer_create", "trainer_ready", "verl: " + LINES["trainer_create"]),
    ("rollout_engine", "rollouter_create", "rollouter_ready", "verl: " + LINES["rollouter_create"]),
    ("first_weight_sync", "sync_start", "sync_done", "verl: " + LINES["sync_start"]),
    ("first_step", "sync_done", FIRST_STEP, "verl: the first training/global_step metric line"),
)
PHASES = ("queued", "runtime_env", "preflight", *(p[0] for p in VERL_PHASES))


def marks_in(lines: Iterable[str]) -> list[str]:
    """The start-up marks these log lines carry, in order (cheap: a substring test a line)."""
    found: list[str] = []
    for line in lines:
        if "[ASYNC MAIN]" not in line and HANDOVER not in line:
            continue
        body = strip_ray_prefix(line.strip())
        found.extend(mark for mark, text in LINES.items() if text in body)
    return found


def record(
    kept: Mapping[str, Any] | None, marks: Iterable[str], at: datetime
) -> dict[str, Any] | None:
    """``kept`` with the marks not seen before set to ``at`` (ISO text); None when nothing is
    new (the first sighting wins: a retried attempt's start-up does not replace the first)."""
    out = dict(kept or {})
    new = {m: at.isoformat() for m in marks if m not in out}
    return out | new if new else None


def _at(marks: Mapping[str, Any], name: str) -> datetime | None:
    value = marks.get(name)
    return datetime.fromisoformat(value) if isinstance(value, str) else None


def _event_at(events: Sequence[Any], status: str) -> datetime | None:
    return next((e.at for e in events if e.to_status == status), None)


def phases(
    created_at: datetime,
    events: Sequence[Any],
    marks: Mapping[str, Any] | None,
    preflight: Mapping[str, Any] | None = None,
    queued_why: str | None = None,
) -> list[dict[str, Any]]:
    """Each phase with ``start``, ``end``, ``seconds`` (None where not seen), ``source`` and a
    ``note``; clamped so that each starts no earlier than the one before it ended."""
    marks = marks or {}
    submitted, running = _event_at(events, "SUBMITTED"), _event_at(events, "RUNNING")
    pre_end = _at(marks, PREFLIGHT)
    pre_start = None
    if pre_end is not None and preflight and isinstance(preflight.get("seconds"), int | float):
        pre_start = pre_end - timedelta(seconds=max(0.0, float(preflight["seconds"])))
    spans: list[tuple[str, datetime | None, datetime | None, str, str | None]] = [
        (
            "queued",
            created_at,
            submitted,
            "service events: accepted (QUEUED) to SUBMITTED",
            queued_why or ("admitted at the first round" if submitted else None),
        ),
        (
            "runtime_env",
            submitted,
            running,
            "service events: SUBMITTED to RUNNING (Ray's job status: runtime env ready)",
            None,
        ),
        (
            "preflight",
            pre_start,
            pre_end,
            "the launcher's rlrun-preflight report line (its own seconds)",
            None,
        ),
    ]
    spans += [(name, _at(marks, a), _at(marks, b), src, None) for name, a, b, src in VERL_PHASES]
    out = []
    floor = created_at
    for name, start, end, source, note in spans:
        seconds = None
        if start is not None and end is not None:
            start = max(start, floor)
            end = floor = max(end, start)
            seconds = (end - start).total_seconds()
        else:
            start = end = None
        out.append(
            {
                "phase": name,
                "start": start,
                "end": end,
                "seconds": seconds,
                "seen": seconds is not None,
                "source": source,
                "note": note if seconds is not None or name == "queued" else "not seen",
            }
        )
    return out


def first_step_seconds(created_at: datetime, marks: Mapping[str, Any] | None) -> float | None:
    """Seconds from acceptance to the first training step, None before it."""
    first = _at(marks or {}, FIRST_STEP)
    return None if first is None else max(0.0, (first - created_at).total_seconds())
