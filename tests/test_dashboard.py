"""The dashboard in a real browser (Debian's Chromium driven by Playwright)."""

from __future__ import annotations

import os
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from service.app import create_app
from tests.conftest import make_settings, wait_for

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
# Outside CI a machine without Chromium skips these; CI installs it, so there they must run.
pytestmark = pytest.mark.skipif(
    not Path(CHROMIUM).exists() and not os.environ.get("CI"),
    reason="needs Debian's chromium (apt-get install -y chromium)",
)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[str]:
    """The real service (no Ray loops) in a uvicorn thread on a free port."""
    settings = make_settings(f"sqlite:///{tmp_path}/ui.db", "http://127.0.0.1:9", run_loops=False)
    config = uvicorn.Config(create_app(settings), host="127.0.0.1", port=0, log_level="warning")
    srv = uvicorn.Server(config)
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    wait_for(lambda: srv.started, bool, timeout=30, every=0.05)
    port = srv.servers[0].sockets[0].getsockname()[1]
    yield f"http://127.0.0.1:{port}"
    srv.should_exit = True
    thread.join(10)


@pytest.fixture
def page(server: str) -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=CHROMIUM,
            args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"],
        )
        page = browser.new_page()
        yield page
        browser.close()


def test_dashboard_lists_runs_and_shows_one_with_its_events_and_command(
    server: str, page: Any
) -> None:
    assert httpx.get(f"{server}/ui/static/vendor/uPlot.iife.min.js").status_code == 200
    ids = [
        httpx.post(
            f"{server}/runs",
            json={"recipe": "test-script", "name": f"run {i}", "team": "vision" if i else "nlp"},
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
    events = page.locator("#events li").all_inner_texts()
    assert "QUEUED → CANCELLED: cancelled before submission" in events[-1]
    assert "'run 0'" in page.locator("#command").inner_text()
