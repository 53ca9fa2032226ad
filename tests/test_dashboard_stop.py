"""The run page's stop at the next checkpoint, in a real browser on a live service: the button
asks for the longest wait, sends ``{"at": "next_checkpoint", "within_s": ...}`` to the cancel
route, then says by when the run stops and why, and offers the stop no more; a dismissed prompt
sends nothing. The run is stored as the service leaves it, so no Ray is needed."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from service.store.db import Database
from service.store.status import RunStatus
from tests.browser import needs_chromium, until
from tests.conftest import served
from tests.factories import add_run, read_run

pytestmark = [needs_chromium, pytest.mark.slow]

SHOWN = "!document.querySelector('#cancel-at-checkpoint').hidden"


def test_stop_at_next_checkpoint_sends_the_wait_asked_and_says_when_the_run_stops(
    sqlite_db: Database,
    page: Any,
) -> None:
    add_run(sqlite_db, "r1", RunStatus.RUNNING)
    with served(sqlite_db.url, migrate_on_start=False) as base:
        sent: list[Any] = []
        page.on("request", lambda r: sent.append(r) if r.method == "POST" else None)
        page.goto(f"{base}/ui/#/runs/r1")
        until(page, SHOWN)
        assert page.locator("#run-stop").is_hidden()
        # Dismissed: nothing is sent, the button stays.
        page.once("dialog", lambda d: d.dismiss())
        page.click("#cancel-at-checkpoint")
        assert sent == [] and page.locator("#cancel-at-checkpoint").is_visible()
        prompts: list[str] = []

        def answer(dialog: Any) -> None:
            prompts.append(dialog.default_value)
            dialog.accept("120")

        page.once("dialog", answer)
        page.click("#cancel-at-checkpoint")
        until(page, "!document.querySelector('#run-stop').hidden")
        assert prompts == ["1800"]
        (request,) = sent
        assert request.url == f"{base}/runs/r1/cancel"
        assert json.loads(request.post_data) == {"at": "next_checkpoint", "within_s": 120}
        doc = httpx.get(f"{base}/runs/r1").json()
        note = page.locator("#run-stop").inner_text()
        assert note.startswith("stops at its next checkpoint, by "), note
        assert note.endswith(f"at the latest: {doc['stop']['reason']}"), (note, doc["stop"])
        assert page.locator("#cancel-at-checkpoint").is_hidden()
        assert page.locator("#run-status").inner_text() == "RUNNING"
        page.goto("about:blank")  # its event stream ends before the server does
        run, reasons = read_run(sqlite_db, "r1")
        assert run.yield_by is not None and run.stop_requested_at is None
        assert "within 120 s" in reasons[-1], reasons
