"""The dashboard's usage view in a real browser on a live service: accelerator-hours per team per
day as stacked bars and a table per team that agrees with ``GET /usage``, a range picked by
dates or a preset. Its screenshot is docs/dashboard-usage.png."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from service import usage
from service.store.db import Database
from service.store.status import RunStatus
from tests.browser import needs_chromium, shot, until
from tests.conftest import served
from tests.factories import new_run

pytestmark = [
    needs_chromium,
    pytest.mark.slow,
]
TEAMS = {"vision": 16, "nlp": 8, "speech": 4, "rl": 2, "infra": 1}


def two_weeks_of_runs(db: Database, today: datetime) -> None:
    """Each team's runs of the last 14 days, ended (as the lifecycle leaves them)."""
    rng = random.Random(3)
    with db.transaction() as s:
        for d in range(14):
            for team, npus in TEAMS.items():
                for i in range(rng.randrange(1, 4)):
                    run = new_run(f"{team}-{d}-{i}", RunStatus.SUCCEEDED, team=team, npus=npus)
                    run.submitted_at = today - timedelta(days=d, hours=rng.uniform(1, 20))
                    s.add(run)
                    s.flush()
                    usage.accrue(s, run, run.submitted_at + timedelta(hours=rng.uniform(0.5, 6)))


def test_the_usage_view_stacks_teams_per_day_and_its_table_agrees_with_the_api(
    sqlite_db: Database,
    page: Any,
) -> None:
    today = datetime.now(UTC).replace(hour=23, minute=0, second=0, microsecond=0)
    today -= timedelta(days=1)  # whole days only: nothing ends after now
    two_weeks_of_runs(sqlite_db, today)
    start = (today - timedelta(days=13)).date().isoformat()
    end = (today + timedelta(days=1)).date().isoformat()
    with served(sqlite_db.url, migrate_on_start=False) as base, httpx.Client(base_url=base) as http:
        expected = http.get("/usage", params={"from": start, "to": end}).json()
        page.goto(f"{base}/ui/#/usage?from={start}&to={end}")
        page.locator("#usage-table tbody tr[data-team]").nth(len(TEAMS) - 1).wait_for()
        shown = {
            row.get_attribute("data-team"): row.locator("td").nth(1).inner_text()
            for row in page.locator("#usage-table tbody tr[data-team]").all()
        }
        assert shown == {
            r["team"]: str(round(r["accelerator_hours"], 1)).removesuffix(".0")
            for r in expected["rows"]
        }
        total = page.locator("#usage-total").inner_text()
        assert float(total) == pytest.approx(expected["total_accelerator_hours"], abs=0.05)
        bars = page.locator("[data-chart='usage']")
        assert bars.get_attribute("data-series") == str(len(TEAMS))
        assert bars.get_attribute("data-days") == "14"
        # The top band of a day is the sum of every team's hours that day.
        per_day = http.get("/usage", params={"from": start, "to": end, "group_by": ["day"]}).json()[
            "rows"
        ]
        tops = page.evaluate("document.querySelector(\"[data-chart='usage']\").plot.data[1]")
        by_day = {r["day"]: r["accelerator_hours"] for r in per_day}
        days = [(today - timedelta(days=13 - i)).date().isoformat() for i in range(14)]
        assert tops == pytest.approx([by_day.get(d, 0.0) for d in days], abs=1e-3)
        shot(page, "dashboard-usage.png")
        # A preset picks the range: the last 7 days (and tomorrow's, still empty).
        page.locator("button[data-days='7']").click()
        until(page, "document.querySelector(\"[data-chart='usage']\")?.dataset.days === '7'")
        assert "from=" in page.evaluate("location.hash")
        page.goto("about:blank")


def test_a_run_waiting_for_its_team_s_budget_says_by_how_much_on_its_page(
    sqlite_db: Database,
    page: Any,
) -> None:
    from service.cluster.inventory_cache import InventoryCache
    from service.loops.submitter import Submitter
    from service.scheduling.admission import Quotas
    from service.scheduling.budgets import Budgets
    from tests.fake_ray import FakeRay
    from tests.test_budgets import used_this_month

    db = sqlite_db
    used_this_month(db, "nlp", 8, 0.5)
    with db.transaction() as s:
        s.add(new_run("r1", RunStatus.QUEUED, team="nlp", npus=8))
    ray = FakeRay({"n0": {"NPU": 8.0, "CPU": 8.0}})
    Submitter(
        db, ray, InventoryCache(ray, 0.0), Quotas(), "me", 30.0, 10, budgets=Budgets({"nlp": 2})
    ).tick()
    with served(db.url, migrate_on_start=False) as base, httpx.Client(base_url=base) as http:
        wait = http.get("/runs/r1").json()["budget_wait"]
        page.goto(f"{base}/ui/#/runs/r1")
        page.locator("#run-budget").wait_for()
        over = f"{round(wait['over_by_hours'], 1):g} NPU-hours over"
        assert page.locator("#over-by").inner_text() == over
        assert "waits for budget" in page.locator("#run-budget").inner_text()
        assert f"for {wait['month']}" in page.locator("#run-budget").inner_text()
        page.goto("about:blank")  # its streams end before the service does
