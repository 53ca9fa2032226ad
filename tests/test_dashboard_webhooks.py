"""The dashboard's webhooks view in a real browser on a live service: a team's subscriptions with
their URL's host (never its path nor a secret), what each hears, paused or active, the newest
attempt and the failures since the last success; a subscription's deliveries with their
attempts; add, pause, resume and remove for a member, none of them for a viewer. Its screenshot
is docs/dashboard-webhooks.png."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import update

from service.app import create_app
from service.notify.sender import Notifier
from service.store.db import Database
from service.store.models import WebhookDelivery, utcnow
from service.store.status import RunStatus
from tests.browser import needs_chromium, shot, until
from tests.conftest import make_settings
from tests.factories import add_run, sqlite_with_tokens
from tests.live import ServerThread
from tests.test_webhooks import LOCAL, Receiver, _fail

pytestmark = [
    needs_chromium,
    pytest.mark.slow,
]


def sign_in(page: Any, token: str) -> None:
    """The sign-in box in the header, as a person uses it."""
    page.locator("#token").fill(token)
    page.locator("#sign-in button[type=submit]").click()


def test_the_webhooks_view_shows_each_subscription_s_standing_and_a_member_s_actions(
    tmp_path: Path,
    page: Any,
) -> None:
    users = ("ann", "vision", "member"), ("vic", "vision", "viewer"), ("ola", "nlp", "member")
    url, (member, viewer, other) = sqlite_with_tokens(tmp_path, "hooks.db", *users)
    db = Database(url)
    settings = make_settings(
        url, "http://127.0.0.1:9", run_loops=False, auth="on", webhook_allow="127.0.0.1/32"
    )
    receiver, failing = Receiver(), Receiver()
    failing.script = [(500, {})] * 6
    notifier = Notifier(db, "test", LOCAL, "http://rlrun.example", timeout_s=5)
    try:
        with ServerThread(create_app(settings)) as base, httpx.Client(base_url=base) as http:
            as_member = {"Authorization": f"Bearer {member}"}

            def subscribe(token: str, body: dict[str, Any]) -> dict[str, Any]:
                resp = http.post(
                    "/webhooks", json=body, headers={"Authorization": f"Bearer {token}"}
                )
                assert resp.status_code == 201, resp.text
                hook: dict[str, Any] = resp.json()
                return hook

            ok = subscribe(
                member, {"url": f"{receiver.url}/T0/B0/s3cr3t-path", "events": ["run.status"]}
            )
            bad = subscribe(
                member,
                {
                    "url": f"{failing.url}/in",
                    "events": ["run.status", "metric.threshold"],
                    "statuses": ["FAILED", "LOST"],
                    "name_pattern": "geo3k-*",
                    "thresholds": [
                        {"key": "critic/score/mean", "op": "<", "value": 0.1, "for_steps": 20}
                    ],
                    "format": "slack",
                },
            )
            theirs = subscribe(other, {"url": f"{receiver.url}/nlp", "events": ["run.failed"]})
            for i in range(2):
                add_run(db, f"r{i}", RunStatus.RUNNING, name=f"geo3k-{i}", team="vision")
                _fail(db, f"r{i}")
            for _ in range(3):
                notifier.tick()
                with db.transaction() as s:  # no waiting for the backoff in a test
                    s.execute(update(WebhookDelivery).values(next_attempt_at=utcnow()))
            listed = {h["id"]: h for h in http.get("/webhooks", headers=as_member).json()}
            assert listed[ok["id"]]["failures"] == 0 and listed[bad["id"]]["failures"] == 6
            assert listed[bad["id"]]["last_attempt"]["status_code"] == 500

            # Signed in before the first call (an anonymous one is a 401, logged as an error).
            page.add_init_script(
                "localStorage.getItem('rlrun-token') ||"
                f" localStorage.setItem('rlrun-token', {member!r})"
            )
            page.goto(f"{base}/ui/#/webhooks")
            rows = page.locator("#webhooks tbody tr[data-hook]")
            until(page, "document.querySelectorAll('#webhooks tbody tr[data-hook]').length === 2")
            shown = {r.get_attribute("data-hook") for r in rows.all()}
            assert shown == {ok["id"], bad["id"]}  # another team's is not there
            assert theirs["id"] not in page.content()
            failing_row = page.locator(f"tr[data-hook='{bad['id']}']")
            assert failing_row.locator("td.host").inner_text() == failing.url.removeprefix(
                "http://"
            )
            assert failing_row.locator("td.failures").inner_text() == "6"
            assert failing_row.locator("td.last").inner_text().startswith("500")
            assert "run.status (FAILED, LOST)" in failing_row.inner_text()
            assert "critic/score/mean < 0.1 for 20 steps" in failing_row.inner_text()
            assert (
                page.locator(f"tr[data-hook='{ok['id']}'] td.last").inner_text().startswith("200")
            )
            # Neither a secret nor a URL's path (a Slack URL's credential) is on the page.
            assert "whsec_" not in page.content() and "s3cr3t-path" not in page.content()

            # A subscription's deliveries, with every attempt's status.
            page.goto(f"{base}/ui/#/webhooks?id={bad['id']}")
            until(page, "document.querySelectorAll('#deliveries tr[data-delivery]').length === 2")
            codes = page.locator("#deliveries td.attempts").all_inner_texts()
            assert codes == ["500 → 500 → 500"] * 2

            # Pause and resume, as PATCH does.
            failing_row.locator("button[data-action='pause']").click()
            failing_row.locator("button[data-action='resume']").wait_for()
            assert "paused by ann" in failing_row.locator("td.state").inner_text()
            assert http.get(f"/webhooks/{bad['id']}", headers=as_member).json()["paused_at"]
            shot(page, "dashboard-webhooks.png")
            failing_row.locator("button[data-action='resume']").click()
            failing_row.locator("button[data-action='pause']").wait_for()
            assert http.get(f"/webhooks/{bad['id']}", headers=as_member).json()["paused_at"] is None

            # Add: a refused URL is told beside the form; an allowed one is listed, its secret not.
            page.locator("#hook-url").fill("http://169.254.169.254/latest")
            page.locator("#hook-add button[type=submit]").click()
            page.locator("#hook-errors li").first.wait_for()
            assert "url" in page.locator("#hook-errors").inner_text()
            page.locator("#hook-url").fill(f"{receiver.url}/added")
            page.locator("#hook-add input[name=status][value=FAILED]").check()
            page.locator("#hook-thresholds").fill("actor/entropy > 5")
            page.locator("#hook-add button[type=submit]").click()
            until(page, "document.querySelectorAll('#webhooks tbody tr[data-hook]').length === 3")
            added = [
                h
                for h in http.get("/webhooks", headers=as_member).json()
                if h["url"].endswith("/added")
            ]
            assert [(h["events"], h["statuses"], h["thresholds"]) for h in added] == [
                (
                    ["run.status", "metric.threshold"],
                    ["FAILED"],
                    [{"key": "actor/entropy", "op": ">", "value": 5.0, "for_steps": 1}],
                )
            ]
            assert "whsec_" not in page.content()
            assert page.locator("#hook-notice").inner_text().startswith(f"Added {added[0]['id']}")

            # Remove, once confirmed.
            page.once("dialog", lambda dialog: dialog.accept())
            page.locator(f"tr[data-hook='{added[0]['id']}'] button[data-action='remove']").click()
            until(page, "document.querySelectorAll('#webhooks tbody tr[data-hook]').length === 2")
            assert http.get(f"/webhooks/{added[0]['id']}", headers=as_member).status_code == 404

            # A viewer sees the same subscriptions and none of the actions.
            sign_in(page, viewer)
            until(page, "!document.querySelector('#hook-add')")
            until(page, "document.querySelectorAll('#webhooks tbody tr[data-hook]').length === 2")
            assert page.locator("#webhooks button").count() == 0
            assert page.locator("#hook-adding").is_hidden()
    finally:
        receiver.close()
        failing.close()
        db.dispose()
