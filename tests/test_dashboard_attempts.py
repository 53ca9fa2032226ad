"""Attempt markers on the run page, in a real browser on a live service: for a run whose second
attempt resumed from step 8, every chart draws one dashed line at step 8, labelled
"attempt 2"; a run of one attempt draws none. The runs are stored as the service leaves them
(attempts, metric points), so no Ray is needed."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from service.metrics import store
from service.metrics.parse import MetricLine
from service.store.db import Database
from service.store.models import RunAttempt, RunLog, utcnow
from service.store.status import RunStatus
from tests.browser import needs_chromium, until
from tests.conftest import served
from tests.factories import new_run

pytestmark = [
    needs_chromium,
    pytest.mark.slow,
]
STEPS = 20
RESUMED = 8
CHARTS = ["reward", "validation", "idle ratio", "staleness"]

# The columns of a chart's plot area (canvas x) where a neutral grey dashed line shows over at
# least a fifth of its height (the marker's stroke: series and bands are coloured, grid lines
# faint), and the dark neutral pixels (the label's ink) in a box just right of the last one.
MARKS = """(title) => {
  const u = document.querySelector(`[data-chart='${title}']`).chart.plot;
  const { left, top, width, height } = u.bbox;
  const px = u.ctx.getImageData(0, 0, u.ctx.canvas.width, u.ctx.canvas.height);
  const at = (x, y) => px.data.slice((y * px.width + x) * 4, (y * px.width + x) * 4 + 4);
  const grey = ([r, g, b, a], below, alpha = 60) =>
    a > alpha && Math.max(r, g, b) - Math.min(r, g, b) < 6 && r < below;
  const columns = [];
  for (let x = left; x < left + width; x++) {
    let n = 0;
    for (let y = top; y < top + height; y++) if (grey(at(x, y), 225)) n++;
    if (n > height / 5) columns.push(x);
  }
  const label = columns.length ? columns[columns.length - 1] : null;
  let ink = 0;
  if (label !== null)
    for (let x = label + 2; x < label + 60; x++)
      for (let y = top; y < top + 16 * devicePixelRatio; y++) if (grey(at(x, y), 140, 20)) ink++;
  return { columns, ink, expected: Math.round(u.valToPos(%d, "x", true)) };
}"""


def _store_runs(db: Database) -> None:
    """ "resumed": attempt 1 failed at step 9, attempt 2 resumed from step 8 and succeeded, one
    series across both; "once": one attempt, the same points."""
    ended = utcnow()
    with db.transaction() as s:
        for run_id, attempt in (("resumed", 2), ("once", 1)):
            run = new_run(run_id, RunStatus.SUCCEEDED, attempt=attempt, ended_at=ended)
            run.resumed_from_step = RESUMED if attempt == 2 else 0
            s.add(run)
            s.add(RunLog(run_id=run_id, log_offset=0, finished_at=ended))
            s.flush()
            lines = [
                (
                    step,
                    MetricLine(
                        step,
                        {
                            "critic/score/mean": step / STEPS,
                            "critic/score/max": min(1.0, step / STEPS + 0.2),
                            "critic/score/min": max(0.0, step / STEPS - 0.2),
                            "val-core/tiny/arith/acc/mean@1": step / STEPS,
                            "fully_async/trainer/idle_ratio": 0.3,
                            "fully_async/rollouter/idle_ratio": 0.2,
                            "fully_async/count/mean_staleness": 0.5,
                        },
                    ),
                )
                for step in range(1, STEPS + 1)
            ]
            store.add_lines(s, run_id, lines)
        s.add(
            RunAttempt(
                run_id="resumed",
                n=1,
                ray_job_id="resumed",
                status=RunStatus.FAILED,
                started_at=ended - timedelta(minutes=5),
                ended_at=ended - timedelta(minutes=2),
                failure={"class": "actor_died", "summary": "", "hint": "", "evidence": []},
                resumed_from_step=0,
            )
        )


def test_every_chart_marks_where_the_second_attempt_began_and_a_single_attempt_has_no_mark(
    sqlite_db: Database,
    page: Any,
) -> None:
    _store_runs(sqlite_db)
    with served(sqlite_db.url, migrate_on_start=False) as base:
        for run_id, markers in (("resumed", f"attempt 2@{RESUMED}"), ("once", "")):
            page.goto(f"{base}/ui/#/runs/{run_id}")
            for title in CHARTS:
                chart = f"document.querySelector(\"[data-chart='{title}']\")"
                until(page, f"{chart}.dataset.points == '{STEPS}'")
            # uPlot paints on the next animation frame after its data is set.
            page.evaluate(
                "new Promise((r) => requestAnimationFrame(() => requestAnimationFrame(r)))"
            )
            shown = page.evaluate(
                "[...document.querySelectorAll('[data-chart]')]"
                ".map((c) => [c.dataset.chart, c.dataset.markers])"
            )
            assert sorted(shown) == sorted([t, markers] for t in CHARTS), shown
            for title in CHARTS:
                drawn = page.evaluate(MARKS % RESUMED, title)
                if markers:
                    # One line, at step 8's place on the x axis, with its label beside it.
                    columns = drawn["columns"]
                    assert columns, (title, drawn)
                    assert max(columns) - min(columns) <= 2, (title, drawn)
                    assert abs(columns[0] - drawn["expected"]) <= 1, (title, drawn)
                    assert drawn["ink"] >= 20, (title, drawn)
                else:
                    assert drawn["columns"] == [], (title, drawn)


def test_a_run_deciding_on_a_retry_and_one_in_its_backoff_show_how_the_last_attempt_ended(
    sqlite_db: Database,
    page: Any,
) -> None:
    now = utcnow()
    died = {"class": "actor_died", "summary": "", "hint": "", "evidence": []}
    with sqlite_db.transaction() as s:
        s.add(new_run("deciding", RunStatus.RETRYING, attempt_status="FAILED", ended_at=now))
        s.add(new_run("waiting", RunStatus.QUEUED, attempt=2, retry_at=now + timedelta(hours=1)))
        s.flush()
        s.add(
            RunAttempt(run_id="waiting", n=1, ray_job_id="waiting", status="FAILED", failure=died)
        )
    with served(sqlite_db.url, migrate_on_start=False) as base:
        for run_id, status, told in (
            ("deciding", "RETRYING", "attempt 1 FAILED: deciding on a next attempt"),
            ("waiting", "QUEUED", "attempt 1 FAILED (actor_died): attempt 2 from "),
        ):
            page.goto(f"{base}/ui/#/runs/{run_id}")
            until(page, f"document.querySelector('#run-status').textContent == '{status}'")
            note = page.locator("#run-retry")
            assert note.is_visible() and note.inner_text().startswith(told), note.inner_text()
            # Not over: it may still be cancelled.
            assert page.locator("#cancel").is_visible()
        page.goto(f"{base}/ui/#/runs")
        until(
            page,
            "[...document.querySelectorAll('.badge')].some((b) => b.textContent == 'RETRYING')",
        )
