"""The dashboard in a real browser (Debian's Chromium driven by Playwright)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from service.app import create_app
from service.cluster.local_ray import LocalRayCluster
from tests.conftest import make_settings
from tests.live import ServerThread

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
# Outside CI a machine without Chromium skips these; CI installs it, so there they must run.
pytestmark = [
    pytest.mark.slow,  # a real browser: the integration layer
    pytest.mark.skipif(
        not Path(CHROMIUM).exists() and not os.environ.get("CI"),
        reason="needs Debian's chromium (apt-get install -y chromium)",
    ),
]


@pytest.fixture
def page() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=CHROMIUM,
            args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"],
        )
        page = browser.new_page(viewport={"width": 1300, "height": 900})
        yield page
        browser.close()


def test_dashboard_lists_runs_and_shows_one_with_its_events_and_command(
    tmp_path: Path, page: Any
) -> None:
    settings = make_settings(f"sqlite:///{tmp_path}/ui.db", "http://127.0.0.1:9", run_loops=False)
    with ServerThread(create_app(settings)) as server:
        assert httpx.get(f"{server}/ui/static/vendor/uPlot.iife.min.js").status_code == 200
        ids = [
            httpx.post(
                f"{server}/runs",
                json={"recipe": "test-script", "name": f"run {i}", "team": "vision"},
            ).json()["id"]
            for i in range(3)
        ]
        httpx.post(f"{server}/runs/{ids[0]}/cancel")
        page.goto(f"{server}/")
        page.wait_for_selector("#runs tbody tr")
        rows = page.locator("#runs tbody tr")
        assert rows.count() == 3
        assert rows.nth(0).inner_text().startswith("run 2")
        page.select_option("#status-filter", "CANCELLED")
        page.wait_for_function("document.querySelectorAll('#runs tbody tr').length === 1")
        page.locator("#runs tbody tr").first.click()
        page.wait_for_selector("#run-pane:not([hidden])")
        assert page.locator("#run-title").inner_text() == f"run 0 ({ids[0]})"
        assert page.locator("#run-status").inner_text() == "CANCELLED"
        assert page.locator("#cancel").is_hidden()
        events = page.locator("#events li").all_inner_texts()
        assert "QUEUED → CANCELLED: cancelled before submission" in events[-1]
        assert "'run 0'" in page.locator("#command").inner_text()


@pytest.mark.ray
def test_dashboard_draws_a_live_tiny_grpo_reward_curve(
    ray_cluster: LocalRayCluster, tmp_path: Path, page: Any
) -> None:
    settings = make_settings(f"sqlite:///{tmp_path}/ui.db", ray_cluster.address)
    with ServerThread(create_app(settings)) as server:
        run_id = httpx.post(f"{server}/runs", json={"recipe": "tiny-grpo"}).json()["id"]
        page.goto(f"{server}/ui/#/runs/{run_id}")
        # The curve appears while the run is still going, pushed by the event stream.
        page.wait_for_selector("[data-chart='reward'] canvas", timeout=90_000)
        page.wait_for_function(
            "document.getElementById('run-status').textContent === 'SUCCEEDED'", timeout=120_000
        )
        latest = dict(row.split("\t") for row in page.locator("#latest tr").all_inner_texts())
        run = httpx.get(f"{server}/runs/{run_id}").json()
        assert float(latest["critic/score/mean"]) == pytest.approx(
            run["metrics"]["latest"]["critic/score/mean"], rel=1e-5
        )
        assert page.locator("#run-progress").inner_text().startswith("step ")
        page.screenshot(path=str(tmp_path / "dashboard.png"))
