"""The baseline in the dashboard, in a real browser: a member of the run's team pins and unpins
it from the run view (a viewer is offered neither); the run list shows each run's difference
from it ("vs baseline"); the compare view starts from the pinned baseline, draws every other
run as its difference from it at the same step, and another baseline (or none) can be chosen
there. Its screenshot is docs/dashboard-baseline.png."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from service.app import create_app
from service.metrics import store
from service.metrics.keys import RESPONSE_LENGTH_KEY, REWARD_KEY, STEP_TIME_KEY
from service.metrics.parse import MetricLine
from service.store.db import Database
from tests.browser import needs_chromium, shot, until
from tests.conftest import make_settings
from tests.factories import add_run, sqlite_with_tokens
from tests.live import ServerThread

pytestmark = [needs_chromium, pytest.mark.slow]

REWARD_CHART = f"[data-chart='{REWARD_KEY} vs baseline']"


def seed(url: str) -> None:
    """Team vision's runs of recipe x: "base" logs steps 1..5 (reward 0.1 x step), "other"
    steps 1..3 (0.05 higher, longer answers, a second faster)."""
    db = Database(url)
    try:
        for run_id in ("base", "other"):
            add_run(db, run_id, team="vision", recipe="x")
        with db.transaction() as s:
            for step in range(1, 6):
                values = {REWARD_KEY: 0.1 * step, RESPONSE_LENGTH_KEY: 100.0, STEP_TIME_KEY: 10.0}
                store.add_lines(s, "base", [(step, MetricLine(step, values))])
            for step in range(1, 4):
                values = {REWARD_KEY: 0.1 * step + 0.05, RESPONSE_LENGTH_KEY: 120.0,
                          STEP_TIME_KEY: 9.0}  # fmt: skip
                store.add_lines(s, "other", [(step, MetricLine(step, values))])
    finally:
        db.dispose()


def signed_in(tab: Any, token: str) -> list[tuple[str, str]]:
    """Signs the page in with ``token``; the API calls it makes from then on (method, path)."""
    tab.add_init_script(
        f"location.protocol === 'http:' && localStorage.setItem('rlrun-token', {token!r})"
    )
    calls: list[tuple[str, str]] = []
    tab.on("request", lambda r: "/ui/" not in r.url and calls.append((r.method, r.url)))
    return calls


def drawn(tab: Any, chart: str) -> list[list[float | None]]:
    """The chart's data as drawn: steps, then a column per run."""
    data: list[list[float | None]] = tab.evaluate(
        f'document.querySelector("{chart}").chart.plot.data.map((c) => [...c])'
    )
    return data


def test_a_member_pins_the_baseline_the_list_and_compare_show_each_run_against_it(
    tmp_path: Path,
    page: Any,
    browser: Any,
) -> None:
    users = ("m", "vision", "member"), ("v", "vision", "viewer")
    url, (member, viewer) = sqlite_with_tokens(tmp_path, "baseline.db", *users)
    seed(url)
    settings = make_settings(url, "http://127.0.0.1:9", run_loops=False, auth="on")
    with ServerThread(create_app(settings)) as base:
        calls = signed_in(page, member)
        # The run view of "base": a member of its team is offered the pin.
        page.goto(f"{base}/ui/#/runs/base")
        until(page, "document.querySelector('#pin-baseline:not([hidden])')")
        assert page.inner_text("#pin-baseline") == "pin as baseline"
        assert ("GET", f"{base}/runs/base?baseline=true") in calls
        page.click("#pin-baseline")
        until(page, "document.querySelector('#pin-baseline').textContent === 'unpin baseline'")
        assert ("PUT", f"{base}/runs/base/baseline") in calls
        assert "the baseline of team vision, recipe x" in page.inner_text("#run-baseline")
        # The other run's view says how it stands against it.
        page.goto(f"{base}/ui/#/runs/other")
        until(page, "document.querySelector('#run-baseline:not([hidden])')")
        assert "vs baseline base: reward +0.05, len +20, s/step -1" in page.inner_text(
            "#run-baseline"
        )
        assert page.inner_text("#pin-baseline") == "pin as baseline"
        # The run list: a "vs baseline" column, read with the page (baseline=true).
        page.goto(f"{base}/ui/#/runs")
        cell = "#runs tr[data-id='other'] td.vs-baseline"
        until(page, f"document.querySelector(\"{cell}\")?.textContent.includes('reward')")
        assert page.inner_text(cell) == "reward +0.05, len +20, s/step -1"
        assert page.inner_text("#runs tr[data-id='base'] td.vs-baseline") == "baseline"
        assert "vs baseline" in page.locator("#runs thead").inner_text()
        assert any(m == "GET" and "/runs?" in u and "baseline=true" in u for m, u in calls)
        # The compare view starts from the pinned baseline: "other" as its difference.
        page.click(f"{cell} a")
        until(page, "location.hash.startsWith('#/compare?runs=base,other&baseline=base')")
        until(page, f"document.querySelector(\"{REWARD_CHART}\")?.dataset.points === '5'")
        steps, base_diff, other_diff = drawn(page, REWARD_CHART)
        assert steps == [1, 2, 3, 4, 5]
        assert base_diff == [0, 0, 0, 0, 0]
        assert [round(v, 9) if v is not None else v for v in other_diff] == [
            0.05,
            0.05,
            0.05,
            None,
            None,
        ]
        row = "#baseline-diff tr[data-id='other']"
        until(page, f'document.querySelector("{row}")')
        cells = page.locator(f"{row} td").all_inner_texts()
        assert cells == ["other", "+0.05", "+20", "-1"]
        assert page.input_value("#compare-baseline") == "base"
        shot(page, "dashboard-baseline.png")
        # Another baseline chosen here: "base" is drawn as its difference from "other" (its
        # steps 4 and 5 against other's newest, step 3).
        page.select_option("#compare-baseline", "other")
        until(page, "location.hash.endsWith('baseline=other')")
        until(page, f"document.querySelector(\"{REWARD_CHART}\")?.dataset.points === '5'")
        until(page, f'document.querySelector("{REWARD_CHART}").chart.plot.data[1][0] < 0')
        _, base_diff, _ = drawn(page, REWARD_CHART)
        rounded = [round(v, 9) for v in base_diff if v is not None]
        assert rounded == [-0.05, -0.05, -0.05, 0.05, 0.15]
        # None: the values themselves, and no differences table.
        page.select_option("#compare-baseline", "none")
        until(page, f"document.querySelector(\"[data-chart='{REWARD_KEY}']\")?.dataset.points")
        assert page.locator(REWARD_CHART).count() == 0
        assert page.locator("#baseline-section").is_hidden()
        # Unpinned from its run view: the list no longer compares.
        page.goto(f"{base}/ui/#/runs/base")
        until(page, "document.querySelector('#pin-baseline').textContent === 'unpin baseline'")
        page.click("#pin-baseline")
        until(page, "document.querySelector('#pin-baseline').textContent === 'pin as baseline'")
        assert ("DELETE", f"{base}/runs/base/baseline") in calls
        assert page.locator("#run-baseline").is_hidden()
        # A viewer of the team sees the run, and is offered no pin.
        as_viewer = browser.new_page()
        try:
            asked = signed_in(as_viewer, viewer)
            as_viewer.goto(f"{base}/ui/#/runs/base")
            until(as_viewer, "document.querySelector('#run-title').textContent.includes('base')")
            until(as_viewer, "document.querySelector('#pin-baseline').dataset.offered")
            assert as_viewer.locator("#pin-baseline").get_attribute("data-offered") == "false"
            assert as_viewer.locator("#pin-baseline").is_hidden()
            assert not any(m in ("PUT", "DELETE") for m, _ in asked)
        finally:
            as_viewer.close()
        page.goto("about:blank")  # its event stream ends before the server does
