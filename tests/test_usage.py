"""Accelerator usage: the sum of accelerators x allocated seconds per team, user, recipe, day and
accelerator, split at midnights, running runs counted up to now; GET /usage as JSON and CSV."""

from __future__ import annotations

import csv
import io
import random
from datetime import UTC, date, datetime, timedelta

import pytest
from fastapi.testclient import TestClient

from service import usage
from service.app import create_app
from service.clock import utcnow
from service.store.db import Database
from service.store.lifecycle import transition
from service.store.models import Run
from service.store.status import RunStatus
from service.store.tokens import create as create_token
from tests.conftest import make_settings
from tests.factories import new_run

DAY = date(2026, 11, 20)
MIDNIGHT = datetime(2026, 11, 20, tzinfo=UTC)


def test_a_run_s_allocation_is_counted_when_it_ends_split_at_midnight(db: Database) -> None:
    submitted = MIDNIGHT - timedelta(hours=1)
    with db.transaction() as s:
        run = new_run("r1", RunStatus.SUCCEEDED, team="vision", npus=8, created_by="ann")
        run.submitted_at = submitted
        s.add(run)
        s.flush()
        usage.accrue(s, run, MIDNIGHT + timedelta(hours=2))
    with db.read() as s:
        rows = usage.report(s, DAY - timedelta(days=1), DAY + timedelta(days=1), ["day", "user"])
    by_day = {r["day"]: r for r in rows}
    assert by_day["2026-11-19"]["accelerator_seconds"] == 8 * 3600
    assert by_day["2026-11-20"]["accelerator_seconds"] == 8 * 2 * 3600
    assert by_day["2026-11-19"]["runs"] == 1 and by_day["2026-11-20"]["runs"] == 0
    assert {r["user"] for r in rows} == {"ann"}


def test_the_lifecycle_counts_a_run_when_it_ends_and_a_running_one_up_to_now(db: Database) -> None:
    now = datetime.now(UTC)
    with db.transaction() as s:
        ended = new_run("r1", RunStatus.RUNNING, team="vision", npus=4)
        ended.submitted_at = now - timedelta(minutes=30)
        running = new_run("r2", RunStatus.RUNNING, team="vision", npus=2)
        running.submitted_at = now - timedelta(minutes=10)
        queued = new_run("r3", RunStatus.QUEUED, team="vision", npus=16)  # holds nothing
        s.add_all([ended, running, queued])
        s.flush()
        transition(s, ended, RunStatus.FAILED, "the job failed")
    with db.read() as s:
        (row,) = usage.report(
            s, now.date() - timedelta(days=1), now.date() + timedelta(days=1), ["team"]
        )
    expected = 4 * 30 * 60 + 2 * 10 * 60
    assert abs(row["accelerator_seconds"] - expected) / expected < 0.01
    assert row["runs"] == 2


def test_a_day_of_synthetic_runs_sums_to_within_one_percent(db: Database) -> None:
    rng = random.Random(7)
    expected: dict[tuple[str, str], float] = {}
    window = (MIDNIGHT, MIDNIGHT + timedelta(days=1))
    with db.transaction() as s:
        for i in range(300):
            team, recipe = rng.choice(["vision", "nlp", "rl"]), rng.choice(["verl", "tiny-grpo"])
            npus = rng.choice([1, 2, 8, 16, 32])
            start = MIDNIGHT + timedelta(seconds=rng.uniform(-6 * 3600, 23 * 3600))
            end = start + timedelta(seconds=rng.uniform(60, 10 * 3600))
            run = new_run(f"r{i}", RunStatus.SUCCEEDED, team=team, npus=npus, recipe=recipe)
            run.submitted_at = start
            s.add(run)
            s.flush()
            usage.accrue(s, run, end)
            inside = (min(end, window[1]) - max(start, window[0])).total_seconds()
            key = (team, recipe)
            expected[key] = expected.get(key, 0.0) + npus * max(0.0, inside)
    with db.read() as s:
        rows = usage.report(s, DAY, DAY + timedelta(days=1), ["team", "recipe"])
    got = {(r["team"], r["recipe"]): r["accelerator_seconds"] for r in rows}
    assert set(got) == set(expected)
    for key, seconds in expected.items():
        assert abs(got[key] - seconds) <= 0.01 * seconds, key


def test_get_usage_shows_a_team_its_own_hours_as_json_or_csv(db_url: str, db: Database) -> None:
    with db.transaction() as s:
        for run_id, team in (("r1", "vision"), ("r2", "speech")):
            run = new_run(run_id, RunStatus.SUCCEEDED, team=team, npus=8)
            run.submitted_at = MIDNIGHT
            s.add(run)
            s.flush()
            usage.accrue(s, run, MIDNIGHT + timedelta(hours=1))
        _, viewer = create_token(s, "val", "vision", "viewer")
        _, admin = create_token(s, "root", "ops", "admin")
    settings = make_settings(db_url, "http://127.0.0.1:9", run_loops=False, auth="on")
    window = {"from": "2026-11-20", "to": "2026-11-21"}
    with TestClient(create_app(settings)) as api:
        mine = api.get("/usage", params=window, headers={"Authorization": f"Bearer {viewer}"})
        assert [r["team"] for r in mine.json()["rows"]] == ["vision"]
        assert mine.json()["total_accelerator_hours"] == 8.0
        every = api.get(
            "/usage",
            params=window | {"group_by": ["team", "day"]},
            headers={"Authorization": f"Bearer {admin}", "Accept": "text/csv"},
        )
        assert every.headers["content-type"].startswith("text/csv")
        table = list(csv.DictReader(io.StringIO(every.text)))
        assert {(r["team"], r["day"], r["accelerator_hours"]) for r in table} == {
            ("vision", "2026-11-20", "8.0"),
            ("speech", "2026-11-20", "8.0"),
        }
        backwards = api.get(
            "/usage",
            params={"from": "2026-11-21", "to": "2026-11-20"},
            headers={"Authorization": f"Bearer {admin}"},
        )
        assert backwards.status_code == 422
        assert backwards.json()["errors"][0]["field"] == "query.from"
        assert (
            api.get(
                "/usage", params={"group_by": "nope"}, headers={"Authorization": f"Bearer {admin}"}
            ).status_code
            == 422
        )


@pytest.mark.parametrize(
    ("window", "field"),
    [
        ({"to": "0001-01-01"}, "query.to"),  # the default from would be before the first day
        ({"from": "9999-12-02", "to": "9999-12-31"}, "query.from"),  # months past the last
        ({"from": "1969-12-31"}, "query.from"),
    ],
)
def test_days_out_of_the_calendar_s_reach_are_a_422_naming_the_field(
    api: TestClient, window: dict[str, str], field: str
) -> None:
    answer = api.get("/usage", params=window)
    assert answer.status_code == 422, answer.text
    assert answer.json()["errors"][0]["field"] == field


def test_rlrun_usage_prints_hours_by_team(db_url: str, db: Database) -> None:
    from typer.testing import CliRunner

    from service.cli import app as cli
    from tests.live import ServerThread

    with db.transaction() as s:
        run = new_run("r1", RunStatus.SUCCEEDED, team="vision", npus=16)
        run.submitted_at = MIDNIGHT
        s.add(run)
        s.flush()
        usage.accrue(s, run, MIDNIGHT + timedelta(minutes=90))
    settings = make_settings(db_url, "http://127.0.0.1:9", run_loops=False)
    with ServerThread(create_app(settings)) as url:
        shown = CliRunner().invoke(
            cli, ["usage", "--from", "2026-11-20", "--to", "2026-11-21", "--server", url]
        )
    assert shown.exit_code == 0, shown.output
    assert "vision" in shown.stdout and "24.0" in shown.stdout


def test_reports_by_team_and_by_user_count_the_same_seconds(db: Database) -> None:
    # A report by team, day or accelerator reads the per-team rows; by user the full ones.
    with db.transaction() as s:
        for i, (team, user, npus) in enumerate(
            (("nlp", "ann", 8), ("nlp", "bob", 2), ("rl", "cy", 4))
        ):
            run = new_run(f"r{i}", RunStatus.SUCCEEDED, team=team, npus=npus, created_by=user)
            run.submitted_at = MIDNIGHT - timedelta(days=40)
            s.add(run)
            s.flush()
            usage.accrue(s, run, MIDNIGHT - timedelta(days=40 - i - 1))
    window = (DAY - timedelta(days=60), DAY + timedelta(days=1))
    with db.read() as s:
        by_team = usage.report(s, *window, ["team"])
        by_user = usage.report(s, *window, ["team", "user"])
        by_day = usage.report(s, *window, ["team", "day"])
    summed: dict[str, float] = {}
    for rows in (by_user, by_day):
        for r in rows:
            summed[r["team"]] = summed.get(r["team"], 0.0) + r["accelerator_seconds"]
    assert {r["team"]: r["accelerator_seconds"] * 2 for r in by_team} == summed
    assert {r["team"]: r["accelerator_seconds"] for r in by_team} == {
        "nlp": 8 * 86400 + 2 * 2 * 86400,
        "rl": 4 * 3 * 86400,
    }


def accelerator_seconds(api: TestClient) -> dict[tuple[tuple[str, str], ...], float]:
    from prometheus_client.parser import text_string_to_metric_families

    found: dict[tuple[tuple[str, str], ...], float] = {}
    for family in text_string_to_metric_families(api.get("/metrics").text):
        for sample in family.samples:
            if sample.name == "rlrun_accelerator_seconds_total":
                found[tuple(sorted(sample.labels.items()))] = sample.value
    return found


def test_prometheus_counts_accelerator_seconds_by_team_and_accelerator(
    db_url: str, db: Database
) -> None:
    now = datetime.now(UTC)
    with db.transaction() as s:
        ended = new_run("r1", RunStatus.SUCCEEDED, team="vision", npus=8, created_by="ann")
        ended.submitted_at = now - timedelta(days=40)
        running = new_run("r2", RunStatus.RUNNING, team="nlp", npus=4, created_by="bob")
        running.submitted_at = now - timedelta(minutes=10)
        s.add_all([ended, running])
        s.flush()
        usage.accrue(s, ended, now - timedelta(days=40) + timedelta(hours=1))
    settings = make_settings(db_url, "http://127.0.0.1:9", run_loops=False)
    with TestClient(create_app(settings)) as api:
        first = accelerator_seconds(api)
        assert set(first) == {
            (("accelerator", "NPU"), ("team", "vision")),
            (("accelerator", "NPU"), ("team", "nlp")),
        }
        assert first[(("accelerator", "NPU"), ("team", "vision"))] == 8 * 3600
        nlp = (("accelerator", "NPU"), ("team", "nlp"))
        assert abs(first[nlp] - 4 * 600) < 4 * 60
        # The running run's count grows, and does not drop when it ends.
        with db.transaction() as s:
            run = s.get(Run, "r2")
            assert run is not None
            transition(s, run, RunStatus.SUCCEEDED, "done")
        second = accelerator_seconds(api)
        assert second[nlp] >= first[nlp]
        assert accelerator_seconds(api)[nlp] == second[nlp]


def test_any_window_sums_what_its_days_hold_whether_read_from_days_or_months(
    db: Database,
) -> None:
    # Months in part are read as their days or as the month less the days outside: the same.
    rng = random.Random(11)
    first = datetime(2026, 8, 1, tzinfo=UTC)
    spans = []
    with db.transaction() as s:
        for i in range(60):
            start = first + timedelta(hours=rng.uniform(0, 120 * 24))
            end = start + timedelta(hours=rng.uniform(1, 60))
            npus = rng.choice([1, 4, 8])
            run = new_run(f"r{i}", RunStatus.SUCCEEDED, team=rng.choice("ab"), npus=npus)
            run.submitted_at = start
            s.add(run)
            s.flush()
            usage.accrue(s, run, end)
            spans.append((start, end, npus))
    windows = [
        (date(2026, 8, 2), date(2026, 11, 29)),  # month less a day, month less two days
        (date(2026, 8, 20), date(2026, 10, 3)),  # days, days
        (date(2026, 8, 1), date(2026, 12, 1)),  # whole months
        (date(2026, 9, 5), date(2026, 9, 25)),  # within one month
    ]
    with db.read() as s:
        for lo, hi in windows:
            w0, w1 = (datetime.combine(d, datetime.min.time(), UTC) for d in (lo, hi))
            expected = sum(
                n * max(0.0, (min(e, w1) - max(b, w0)).total_seconds()) for b, e, n in spans
            )
            counted = sum(1 for b, _, _ in spans if w0 <= b < w1)
            for groups in (["team"], ["user"]):
                rows = usage.report(s, lo, hi, groups)  # type: ignore[arg-type]
                got = sum(r["accelerator_seconds"] for r in rows)
                assert abs(got - expected) <= 1e-6 * expected + 1e-3, (lo, hi, groups)
                assert sum(r["runs"] for r in rows) == counted, (lo, hi, groups)


def _history(db: Database, now: datetime, gpus: bool) -> None:
    """Ten days of ended runs of four teams, and runs still running: some on days and teams
    with ended runs, one on a team with none; with ``gpus``, GPU runs beside the NPU ones."""
    rng = random.Random(5)
    with db.transaction() as s:
        for d in range(0, 10, 3) if gpus else ():
            run = new_run(f"gpu{d}", RunStatus.SUCCEEDED, team="a", npus=2)
            run.launch = run.launch | {"shape": run.launch["shape"] | {"accelerator": "GPU"}}
            run.submitted_at = now - timedelta(days=d, hours=1)
            s.add(run)
            s.flush()
            usage.accrue(s, run, run.submitted_at + timedelta(minutes=30))
        for d in range(10):
            for team in ("a", "b", "c", "d"):
                if rng.random() < 0.3:
                    continue  # a team idle that day: no row
                run = new_run(f"{team}{d}", RunStatus.SUCCEEDED, team=team, npus=4)
                run.submitted_at = now - timedelta(days=d, hours=rng.uniform(2, 20))
                s.add(run)
                s.flush()
                usage.accrue(s, run, run.submitted_at + timedelta(hours=1))
        for i, (team, hours) in enumerate((("a", 30), ("b", 3), ("e", 50))):
            run = new_run(f"live{i}", RunStatus.RUNNING, team=team, npus=8)
            run.submitted_at = now - timedelta(hours=hours)
            s.add(run)


@pytest.mark.parametrize("gpus", [False, True], ids=["one accelerator kind", "NPUs and GPUs"])
def test_get_usage_by_day_pages_through_exactly_the_whole_report(
    db_url: str, db: Database, gpus: bool
) -> None:
    now = utcnow()
    _history(db, now, gpus)
    lo, hi = (now - timedelta(days=12)).date(), (now + timedelta(days=1)).date()
    with db.read() as s:
        whole = usage.report(s, lo, hi, ["team", "day"], now=now)
    settings = make_settings(db_url, "http://127.0.0.1:9", run_loops=False)
    window = {"from": lo.isoformat(), "to": hi.isoformat(), "group_by": ["team", "day"]}
    with TestClient(create_app(settings)) as api:
        rows, cursor, pages = [], None, 0
        while True:
            params = window | {"limit": 7} | ({"cursor": cursor} if cursor else {})
            page = api.get("/usage", params=params).json()
            assert len(page["rows"]) <= 7 and page["total_rows"] == len(whole)
            rows += page["rows"]
            pages += 1
            cursor = page["next_cursor"]
            if cursor is None:
                break
        assert pages == -(-len(whole) // 7)
        # By day, then team; every row once, each as the whole report counts it (running runs
        # up to the moment of each page's read).
        assert [(r["day"], r["team"]) for r in rows] == sorted((r["day"], r["team"]) for r in whole)
        by_key = {(r["day"], r["team"]): r for r in whole}
        for r in rows:
            expected = by_key[r["day"], r["team"]]
            assert r["runs"] == expected["runs"]
            assert abs(r["accelerator_seconds"] - expected["accelerator_seconds"]) < 8 * 60
        assert ("e" in {r["team"] for r in rows}) and page["total_accelerator_hours"] > 0
        # By team: largest first, paged the same way.
        first = api.get("/usage", params=window | {"group_by": "team", "limit": 2}).json()
        second = api.get(
            "/usage", params=window | {"group_by": "team", "cursor": first["next_cursor"]}
        ).json()
        teams = [r["team"] for r in first["rows"] + second["rows"]]
        hours = [r["accelerator_hours"] for r in first["rows"] + second["rows"]]
        assert len(teams) == first["total_rows"] == 5 and hours == sorted(hours, reverse=True)
        assert second["next_cursor"] is None
        # A cursor is a next_cursor of the same report, or a 422 at cursor.
        for bad in ("nope", first["next_cursor"]):
            refused = api.get("/usage", params=window | {"cursor": bad})
            assert refused.status_code == 422, bad
            assert refused.json()["errors"][0]["field"] == "query.cursor"
