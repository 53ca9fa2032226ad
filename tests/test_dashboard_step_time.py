"""The run view in a real browser (Chromium): the start-up strip (phases timed from this
project's real verl CPU run log, "not seen" where no line came) and where a step's time goes
(the verdict, verl's gaps noted, the chart of wait, update, sync and the rest, and the change of
split that opens the submit form with its spec)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import httpx
import pytest

from service.store.db import Database
from service.store.models import Run
from tests.browser import needs_chromium, shot, until
from tests.conftest import served
from tests.test_startup import _real_lines, _stamped_marks
from tests.test_step_time import rollout_bound, store_lines

pytestmark = [needs_chromium, pytest.mark.slow]


def test_the_run_view_shows_its_startup_strip_and_where_its_step_time_goes(
    sqlite_db: Database, page: Any
) -> None:
    with (
        served(sqlite_db.url, migrate_on_start=False) as url,
        httpx.Client(base_url=url, timeout=60) as api,
    ):
        preset = {"recipe": "verl-fully-async", "preset": "geo3k-qwen3vl-8b-npu", "name": "slow"}
        run_id = api.post("/runs", json=preset).json()["id"]
        store_lines(sqlite_db.url, run_id, rollout_bound())
        with sqlite_db.transaction() as s:
            run = s.get(Run, run_id)
            assert run is not None
            run.created_at = datetime(2026, 12, 6, 8, 4, 30, tzinfo=UTC)
            run.startup = _stamped_marks(_real_lines())
        page.goto(f"{url}/#/runs/{run_id}")
        until(page, "document.querySelectorAll('#startup .phase').length === 7")
        phases = page.evaluate(
            "[...document.querySelectorAll('#startup .phase')]"
            ".map((e) => [e.dataset.phase, e.className, e.textContent])"
        )
        by = {name: (cls, text) for name, cls, text in phases}
        assert "unseen" in by["preflight"][0] and by["preflight"][1].endswith("not seen")
        assert "seen" in by["rollout_engine"][0] and by["rollout_engine"][1].endswith(" s")
        until(page, "document.querySelector('#step-verdict').textContent.includes('rollout-bound')")
        assert "#6693" in page.inner_text("#step-notes")
        until(page, "document.querySelector(\"[data-chart='step time']\") !== null")
        change = page.inner_text("#step-change")
        assert "NPUs from the trainer group to the rollout group" in change
        shot(page, "dashboard-step-time.png")
        page.click("#step-change a")
        until(page, "document.querySelector('#spec-json, textarea') !== null")
        until(page, f"location.hash.includes('from={run_id}')")
        # Left before the service stops, so that its live stream does not try to reconnect.
        page.goto("about:blank")
