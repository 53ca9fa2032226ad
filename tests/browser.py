"""The browser tests' shared parts: where they find Chromium and how each of them skips without
it (one mark and one fixture check, with the install hint; CI installs Chromium, so there none
of them skips), the ``browser`` and ``page`` fixtures (loaded for every test module by
``conftest``), and the page helpers the views' tests share."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import wait_for

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
INSTALL_HINT = "needs Debian's chromium (apt-get install -y chromium)"
# Where the views' screenshots are kept.
DOCS = Path(__file__).resolve().parents[1] / "docs"


def chromium_missing() -> bool:
    """Outside CI a machine without Chromium skips the browser tests; in CI they must run."""
    return not Path(CHROMIUM).exists() and not os.environ.get("CI")


# For a module of browser tests; a test elsewhere that asks for the ``browser`` (or ``page``)
# fixture skips the same way from the fixture.
needs_chromium = pytest.mark.skipif(chromium_missing(), reason=INSTALL_HINT)


def skip_without_chromium() -> None:
    if chromium_missing():
        pytest.skip(INSTALL_HINT)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Chromium, one per test module (Playwright is imported only by a test that asks)."""
    skip_without_chromium()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        chromium = pw.chromium.launch(
            executable_path=CHROMIUM,
            args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"],
        )
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    """A fresh page; at its end, no console error or uncaught exception but an expected
    refusal (a 422 on a bad spec, which the browser logs as a failed load)."""
    tab = browser.new_page(viewport={"width": 1400, "height": 1000})
    errors: list[str] = []
    tab.on("console", lambda m: m.type == "error" and errors.append(m.text))
    tab.on("pageerror", lambda e: errors.append(str(e)))
    yield tab
    tab.close()
    assert [e for e in errors if "status of 422" not in e] == []


def until(page: Any, expression: str, timeout: float = 30_000) -> None:
    """Poll a page expression until it is truthy (``page.evaluate`` is not subject to the
    page's CSP; ``wait_for_function`` evaluates strings, which the policy forbids).

    A view renders after a click or a hash change, so an expression may first throw (its
    element is not there yet, or the page is between documents); that counts as not yet, and
    the last error is what a timeout reports."""
    from playwright.sync_api import Error as PlaywrightError

    def probe() -> Any:
        try:
            return page.evaluate(expression)
        except PlaywrightError as e:
            return e

    wait_for(probe, lambda v: bool(v) and not isinstance(v, PlaywrightError), timeout / 1000)


def chart_eval(page: Any, chart: str, expression: str) -> Any:
    """``expression`` of the chart titled ``chart`` (``c``: its Chart, ``c.plot`` its uPlot)."""
    return page.evaluate(
        f"(() => {{ const c = document.querySelector(\"[data-chart='{chart}']\").chart;"
        f" return {expression}; }})()"
    )


def shot(page: Any, name: str, **options: Any) -> None:
    """The page's screenshot, kept in ``docs/`` as ``name`` (the whole page unless told)."""
    DOCS.mkdir(exist_ok=True)
    page.screenshot(path=str(DOCS / name), **({"full_page": True} | options))
