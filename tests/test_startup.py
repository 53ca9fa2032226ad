"""A run's start-up timeline: the marks read from this project's real verl CPU run log (kept in
the failure corpus), timed as the follower reads them, the phases built from them with the
service's events (each >= 0 s, never overlapping, adding up to no more than the time to the
first step; "not seen" where no line came), GET /runs/{id}'s ``startup`` and the /metrics
histogram of the time to the first step."""

from __future__ import annotations

import itertools
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import get_args

from fastapi.testclient import TestClient

from service.loops.follower import Follower
from service.metrics import startup
from service.metrics.health import HealthRules
from service.metrics.log_readers import WholeLogReader
from service.store.db import Database
from service.store.status import RunStatus
from service.wire.runs import StartupPhaseOut
from tests.factories import add_run, read_run
from tests.fake_ray import FakeRay

CPU_RUN = Path(__file__).parent / "data" / "failures" / "actor_died-10.log"
T0 = datetime(2026, 12, 6, 8, 0, tzinfo=UTC)
# Stamps on the real log's lines: Ray's ("2026-12-06 08:06:16,856") and verl's
# ("INFO:2026-12-06 08:13:27,060:").
STAMP = re.compile(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3})")


def _real_lines() -> list[str]:
    return CPU_RUN.read_text(encoding="utf-8").splitlines(keepends=True)[2:]  # after the header


def test_the_real_cpu_runs_log_carries_every_verl_mark_in_order() -> None:
    assert startup.marks_in(_real_lines()) == [
        "trainer_create",
        "trainer_ready",
        "rollouter_create",
        "rollouter_ready",
        "sync_start",
        "sync_done",
    ]


def _stamped_marks(lines: list[str]) -> dict[str, str]:
    """Each mark at the newest stamp printed on or before its line (as a follower reading the
    log as it is written would see it, give or take its read interval)."""
    marks: dict[str, str] = {}
    now: datetime | None = None
    for line in lines:
        if m := STAMP.search(line):
            now = datetime.strptime(f"{m[1]}.{m[2]}", "%Y-%m-%d %H:%M:%S.%f").replace(tzinfo=UTC)
        assert now is not None
        found = startup.marks_in([line])
        if "training/global_step" in line:
            found.append(startup.FIRST_STEP)
        marks |= startup.record(marks, found, now) or {}
    return marks


def test_the_real_runs_phases_are_each_at_least_zero_and_add_up_within_its_first_step() -> None:
    marks = _stamped_marks(_real_lines())
    created = datetime(2026, 12, 6, 8, 4, 30, tzinfo=UTC)  # accepted just before Ray's set-up
    events = [
        SimpleNamespace(to_status="SUBMITTED", at=created + timedelta(seconds=5)),
        SimpleNamespace(to_status="RUNNING", at=created + timedelta(seconds=90)),
    ]
    phases = startup.phases(created, events, marks)
    by = {p["phase"]: p for p in phases}
    assert [p["phase"] for p in phases] == list(startup.PHASES)
    assert by["preflight"]["note"] == "not seen"  # a job submitted by hand: no launcher
    for name in ("queued", "runtime_env", "workers_and_model", "rollout_engine"):
        assert by[name]["seen"] and by[name]["seconds"] >= 0, by[name]
    assert by["workers_and_model"]["seconds"] > 10  # trainer's workers and model: tens of s
    assert by["rollout_engine"]["seconds"] > 60  # vLLM's CPU engine: minutes here
    seen = [p for p in phases if p["seen"]]
    for a, b in itertools.pairwise(seen):
        assert a["end"] <= b["start"]
    total = startup.first_step_seconds(created, marks)
    assert total is not None
    assert sum(p["seconds"] for p in seen) <= total


def test_an_unseen_phase_is_not_seen_and_a_late_event_never_makes_a_phase_negative() -> None:
    events = [
        SimpleNamespace(to_status="SUBMITTED", at=T0 + timedelta(seconds=30)),
        SimpleNamespace(to_status="RUNNING", at=T0 + timedelta(seconds=60)),
    ]
    marks = {startup.PREFLIGHT: (T0 + timedelta(seconds=50)).isoformat()}
    phases = startup.phases(T0, events, marks, {"seconds": 40.0}, "capacity: 16 NPUs free")
    by = {p["phase"]: p for p in phases}
    assert by["queued"]["seconds"] == 30 and by["queued"]["note"] == "capacity: 16 NPUs free"
    # The report says 40 s ending at 50 s, but RUNNING was read at 60 s: clamped, never < 0.
    assert by["preflight"]["seconds"] == 0
    for name in ("workers_and_model", "rollout_engine", "first_weight_sync", "first_step"):
        assert by[name] == by[name] | {"seen": False, "seconds": None, "note": "not seen"}
    assert startup.first_step_seconds(T0, marks) is None


def test_the_follower_records_each_mark_once_when_it_reads_the_line(db: Database) -> None:
    run_id, ray = add_run(db, "r1", RunStatus.RUNNING), FakeRay()
    follower = Follower(db, ray, "one", 30, 1_000_000, HealthRules(), reader=WholeLogReader(ray))
    lines = _real_lines()
    half = next(i for i, line in enumerate(lines) if "Param sync before fit" in line)
    ray.log[run_id] = "".join(lines[:half])
    follower.tick()
    first, _ = read_run(db, run_id)
    assert first.startup is not None
    assert set(first.startup) == {
        "trainer_create",
        "trainer_ready",
        "rollouter_create",
        "rollouter_ready",
    }
    ray.log[run_id] += "".join(lines[half:])
    follower.tick()
    second, _ = read_run(db, run_id)
    assert second.startup is not None
    assert set(second.startup) == set(first.startup) | {"sync_start", "sync_done", "first_step"}
    for mark, at in first.startup.items():
        assert second.startup[mark] == at  # the first sighting is kept


def test_the_run_shows_its_startup_and_metrics_count_its_time_to_first_step(
    api: TestClient, db_url: str
) -> None:
    db = Database(db_url)
    try:
        created = datetime.now(UTC) - timedelta(minutes=5)
        marks = {"sync_done": created + timedelta(seconds=100), "first_step": created}
        marks["first_step"] = created + timedelta(seconds=130)
        add_run(
            db,
            "r-started",
            RunStatus.RUNNING,
            created_at=created,
            startup={k: v.isoformat() for k, v in marks.items()},
        )
    finally:
        db.dispose()
    run = api.get("/runs/r-started").json()
    assert run["time_to_first_step"] == 130
    # Every phase, in order: the wire model's list is the module's.
    assert [p["phase"] for p in run["startup"]] == list(startup.PHASES)
    assert get_args(StartupPhaseOut.model_fields["phase"].annotation) == startup.PHASES
    by = {p["phase"]: p for p in run["startup"]}
    assert by["first_step"]["seconds"] == 30 and by["first_step"]["seen"]
    assert by["rollout_engine"]["note"] == "not seen"
    text = api.get("/metrics").text
    assert 'rlrun_time_to_first_step_seconds_bucket{le="120.0"} 0.0' in text
    assert 'rlrun_time_to_first_step_seconds_bucket{le="300.0"} 1.0' in text
    assert "rlrun_time_to_first_step_seconds_count 1.0" in text
