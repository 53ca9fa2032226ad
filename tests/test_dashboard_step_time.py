"""The run view in a real browser (Chromium): the start-up strip (phases timed from this
project's real verl CPU run log, "not seen" where no line came) and where a step's time goes
(the verdict, verl's gaps noted, the chart of wait, update, sync and the rest, and the change of
split that opens the submit form with its spec)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import sync_playwright

from service.app import create_app
from service.metrics import store
from service.metrics.keys import (
    GEN_KEY,
    PARAM_SYNC_KEY,
    ROLLOUTER_IDLE_KEY,
    STEP_TIME_KEY,
    TRAINER_IDLE_KEY,
    UPDATE_ACTOR_KEY,
)
from service.metrics.parse import parse_line
from service.store.db import Database
from service.store.models import Run
from tests.browser import CHROMIUM, needs_chromium, skip_without_chromium
from tests.conftest import make_settings
from tests.live import ServerThread
from tests.test_dashboard import until
from tests.test_startup import _real_lines, _stamped_marks

DOCS = Path(__file__).resolve().parents[1] / "docs"
pytestmark = [needs_chromium, pytest.mark.slow]


@pytest.fixture
def page(tmp_path: Path) -> Iterator[Any]:
    skip_without_chromium()
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        p = browser.new_page(viewport={"width": 1400, "height": 1000})
        errors: list[str] = []
        p.on("pageerror", lambda e: errors.append(str(e)))
        yield p
        browser.close()
        assert errors == []


def test_the_run_view_shows_its_startup_strip_and_where_its_step_time_goes(
    tmp_path: Path, page: Any
) -> None:
    db_url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    settings = make_settings(db_url, "http://127.0.0.1:9", run_loops=False)
    with ServerThread(create_app(settings)) as url, httpx.Client(base_url=url, timeout=60) as api:
        preset = {"recipe": "verl-fully-async", "preset": "geo3k-qwen3vl-8b-npu", "name": "slow"}
        run_id = api.post("/runs", json=preset).json()["id"]
        lines = [
            f"step:{n} - {STEP_TIME_KEY}:100.0 - {GEN_KEY}:60.0 - {UPDATE_ACTOR_KEY}:30.0 - "
            f"{PARAM_SYNC_KEY}:5.0 - {TRAINER_IDLE_KEY}:0.01 - {ROLLOUTER_IDLE_KEY}:0.02"
            for n in range(1, 11)
        ]
        marks = _stamped_marks(_real_lines())
        db = Database(db_url)
        try:
            with db.transaction() as s:
                store.add_lines(
                    s, run_id, [(n, m) for n, x in enumerate(lines) if (m := parse_line(x))]
                )
                run = s.get(Run, run_id)
                assert run is not None
                run.created_at = datetime(2026, 12, 6, 8, 4, 30, tzinfo=UTC)
                run.startup = marks
        finally:
            db.dispose()
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
        page.screenshot(path=str(DOCS / "dashboard-step-time.png"), full_page=True)
        page.click("#step-change a")
        until(page, "document.querySelector('#spec-json, textarea') !== null")
        until(page, f"location.hash.includes('from={run_id}')")
