"""The dashboard's samples view of a run in a real browser: a table by step with scores and
lengths, filters by score and text, a row opened whole, one prompt across steps side by side,
the score distribution per step; a response carrying a script tag and an ``onerror`` attribute
is shown as text and nothing of it runs. Its screenshot is docs/dashboard-samples.png."""

from __future__ import annotations

import json
from typing import Any

import pytest

from jobs import samples as job_samples
from service.metrics import samples
from service.store.db import Database
from service.store.models import RunLog
from tests.browser import needs_chromium, shot, until
from tests.conftest import served
from tests.factories import add_run

pytestmark = [needs_chromium, pytest.mark.slow]

HOSTILE = (
    '<script>window.pwned = 1</script><img src=x onerror="window.pwned = 2">'
    "</pre><b>bold</b> the answer is 4"
)


def seed(db: Database, run_id: str) -> None:
    framed = []
    for step in (1, 2, 3):
        for i in range(4):
            text = f"Question {i}: what is {i} + {i}?"
            out = HOSTILE if (step, i) == (3, 3) else f"step {step}: {2 * i}" + " so" * (i * 10)
            row = {"input": text, "output": out, "gts": str(2 * i), "step": step,
                   "score": float((i + step) % 2), "acc": i % 2 == 0}  # fmt: skip
            framed.append(job_samples.PREFIX + json.dumps(row))
    with db.transaction() as s:
        runlog = RunLog(run_id=run_id, log_offset=0)
        s.add(runlog)
        s.flush()
        samples.ingest(s, runlog, samples.parse(framed), samples.Bounds())


def test_samples_view_shows_filters_opens_and_never_runs_model_output(
    sqlite_db: Database,
    page: Any,
) -> None:
    run_id = add_run(sqlite_db, "run-samples")
    seed(sqlite_db, run_id)
    with served(sqlite_db.url, migrate_on_start=False) as base:
        page.goto(f"{base}/ui/#/runs/{run_id}")
        until(page, "document.querySelector('#run-samples')")
        page.locator("#run-samples").click()
        until(page, "document.querySelectorAll('#samples-table .sample-row').length === 12")
        assert "12 samples kept" in page.locator("#samples-counts").inner_text()
        # The score distribution per step: three steps drawn.
        until(page, "document.querySelector(\"[data-chart='sample scores']\")?.dataset.points")
        points = page.evaluate("document.querySelector(\"[data-chart='sample scores']\").dataset")
        assert points["points"] == "3" and points["series"] == "3"
        # The newest first: step 3's hostile response, as text.
        first = page.locator("#samples-table .sample-row").first
        assert first.get_attribute("data-step") == "3"
        first.click()
        until(page, "!document.querySelector('#sample-detail').hidden")
        got = page.evaluate(
            "document.querySelector(\"#sample-detail [data-field='output']\").textContent"
        )
        assert got == HOSTILE
        assert (
            page.evaluate("document.querySelectorAll('#view img, #view script, #view b').length")
            == 0
        )
        assert page.evaluate("window.pwned === undefined")
        shot(page, "dashboard-samples.png")
        # Filters: by score, then by text.
        page.locator("#samples-min-score").fill("0.5")
        page.locator("#samples-filters button[type=submit]").click()
        until(page, "location.hash.includes('min_score=0.5')")
        until(page, "document.querySelectorAll('#samples-table .sample-row').length === 6")
        page.locator("#samples-q").fill("what is 2")
        page.locator("#samples-filters button[type=submit]").click()
        until(page, "location.hash.includes('q=')")
        until(page, "document.querySelectorAll('#samples-table .sample-row').length === 2")
        # One prompt across steps, side by side.
        page.locator("#samples-table .sample-row").first.click()
        page.locator("#sample-detail .prompt-link").click()
        until(page, "document.querySelectorAll('#prompt-across .side').length === 3")
        steps = page.evaluate(
            "[...document.querySelectorAll('#prompt-across .side')].map((s) => s.dataset.step)"
        )
        assert steps == ["1", "2", "3"]
        assert page.evaluate("window.pwned === undefined")
