"""The dashboard in a real browser (Debian's Chromium driven by Playwright) on a live service
running real tiny-grpo runs. Each view's screenshot is kept in ``docs/``."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from service.app import create_app
from service.cluster.local_ray import LocalRayCluster
from tests.browser import chart_eval, needs_chromium, shot, until
from tests.conftest import TERMINAL, make_settings, wait_status
from tests.factories import sqlite_with_tokens
from tests.live import ServerThread

pytestmark = [
    needs_chromium,
    pytest.mark.ray,
    pytest.mark.slow,
]
HOSTILE = '<img src=x onerror="window.pwned=1"> waiting'
TINY = {"recipe": "tiny-grpo", "team": "research", "total_rollout_steps": 400}


@dataclass
class Live:
    url: str
    tiny: list[str]  # two tiny-grpo runs, started with the module
    training: str  # a tiny-grpo run that outlasts the module (cancelled at its end)
    holder: str  # holds team "capped"'s whole quota
    waiting: str  # queued behind the quota


@pytest.fixture(scope="module")
def live(ray_cluster: LocalRayCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    db = tmp_path_factory.mktemp("ui") / "ui.db"
    settings = make_settings(
        f"sqlite:///{db}",
        ray_cluster.address,
        follow_interval_s=0.3,
        events_poll_s=0.3,
        team_quotas={"capped": 2},
    )
    with ServerThread(create_app(settings)) as url, httpx.Client(base_url=url) as http:

        def post(body: dict[str, Any]) -> str:
            resp = http.post("/runs", json=body)
            assert resp.status_code == 201, resp.text
            run_id: str = resp.json()["id"]
            return run_id

        tiny = [post(TINY | {"name": "tiny lr 2"}), post(TINY | {"name": "tiny lr 1", "lr": 1.0})]
        # Still training whenever a test looks: a slow machine may finish the short ones first.
        training = post(TINY | {"name": "tiny long", "total_rollout_steps": 1_000_000})
        hold = {"recipe": "test-script", "team": "capped", "npus": 2, "seconds": 900}
        holder = post(hold | {"name": "holder"})
        wait_status(http, holder, {"RUNNING"}, timeout=90)
        waiting = post(hold | {"name": HOSTILE})
        yield Live(url, tiny, training, holder, waiting)
        for run_id in (*tiny, training, holder, waiting):
            http.post(f"/runs/{run_id}/cancel")
        for run_id in (*tiny, training, holder):
            wait_status(http, run_id, TERMINAL, timeout=60)


def test_the_page_has_no_inline_script_and_a_strict_script_policy(live: Live) -> None:
    resp = httpx.get(f"{live.url}/ui/")
    assert "script-src 'self'" in resp.headers["content-security-policy"]
    assert "<script>" not in resp.text and "<script src=" in resp.text
    assert httpx.get(f"{live.url}/ui/static/vendor/uPlot.iife.min.js").status_code == 200


def test_runs_view_lists_runs_and_updates_live_without_reload(live: Live, page: Any) -> None:
    page.goto(f"{live.url}/ui/#/runs")
    page.evaluate("window.notReloaded = true")
    row = page.locator(f"#runs tr[data-id='{live.training}']")
    row.wait_for()
    assert "tiny long" in row.inner_text() and "research" in row.inner_text()
    assert "tiny-grpo" in row.inner_text()
    waiting = page.locator(f"#runs tr[data-id='{live.waiting}']")
    assert waiting.locator(".badge").inner_text() == "QUEUED"
    # A name is text, never markup.
    assert HOSTILE in waiting.inner_text() and waiting.locator("img").count() == 0
    # Progress and the reward sparkline arrive while the page stays open.
    row.locator(".reward svg polyline").wait_for(timeout=120_000)
    first = row.locator(".progress").inner_text()
    until(
        page,
        f"""() => {{
            const p = document.querySelector("#runs tr[data-id='{live.training}'] .progress");
            return p && p.textContent !== {first!r};
        }}""",
        timeout=120_000,
    )
    assert page.evaluate("window.notReloaded") is True
    assert page.evaluate("window.pwned") is None
    shot(page, "dashboard-runs.png")
    # Two runs picked in the list open side by side.
    for run_id in live.tiny:
        page.check(f"#runs tr[data-id='{run_id}'] input[type=checkbox]")
    page.click("#compare-selected")
    until(
        page,
        f"location.hash === '#/compare?runs={live.tiny[1]},{live.tiny[0]}'"
        f" || location.hash === '#/compare?runs={live.tiny[0]},{live.tiny[1]}'",
    )
    page.goto(f"{live.url}/ui/#/runs")
    # Filters are part of the URL, so a filtered view can be shared.
    page.select_option("#status-filter", "QUEUED")
    until(page, "location.hash.includes('status=QUEUED')")
    until(page, "document.querySelectorAll('#runs tbody tr').length === 1")
    assert page.locator("#runs tbody tr").get_attribute("data-id") == live.waiting
    # No match is said in words, not shown as an empty table.
    page.goto(f"{live.url}/ui/#/runs?team=nobody")
    page.locator("#no-runs").wait_for()
    assert "No runs match" in page.locator("#no-runs").inner_text()
    # With auth off there is nothing to sign in to.
    assert page.locator("#sign-in").count() == 0


def test_run_view_draws_curves_live_and_shows_everything_about_the_run(
    live: Live, page: Any
) -> None:
    # Curves are drawn live: the training run's reward reaches later steps while the page is open.
    page.goto(f"{live.url}/ui/#/runs/{live.training}")
    page.evaluate("window.notReloaded = true")
    page.locator("[data-chart='reward'] canvas").wait_for(timeout=120_000)
    last_step = "document.querySelector(\"[data-chart='reward']\").chart.plot.data[0].at(-1)"
    drawn = page.evaluate(last_step)
    until(page, f"{last_step} > {drawn}", timeout=120_000)
    assert page.evaluate("window.notReloaded") is True
    # A run followed to its end, with everything about it.
    run_id = live.tiny[1]
    page.goto(f"{live.url}/ui/#/runs/{run_id}")
    page.evaluate("window.notReloaded = true")
    reward = page.locator("[data-chart='reward']")
    reward.locator("canvas").wait_for(timeout=120_000)
    assert reward.get_attribute("data-series") == "3"  # mean, max and min (the band)
    until(
        page, "document.getElementById('run-status').textContent === 'SUCCEEDED'", timeout=180_000
    )
    assert page.evaluate("window.notReloaded") is True
    for chart in (
        "validation",
        "idle ratio",
        "staleness",
        "stale trajectories",
        "partial rollouts",
    ):
        page.locator(f"[data-chart='{chart}'] canvas").wait_for()
    # Both axes titled; steps tick only at whole numbers.
    for chart in ("reward", "validation", "staleness"):
        box = page.locator(f"[data-chart='{chart}']")
        assert box.get_attribute("data-x-label") == "step" and box.get_attribute("data-y-label")
        ticks = (box.get_attribute("data-x-ticks") or "").split(",")
        assert ticks and all(float(t) == int(float(t)) for t in ticks), (chart, ticks)
    # One quantity per chart: the mean staleness apart from the cumulative count.
    assert page.locator("[data-chart='staleness']").get_attribute("data-series") == "1"
    assert page.locator("[data-chart='stale trajectories']").get_attribute("data-series") == "1"
    # The reward's mean is drawn bolder than its band's edges, over a faint fill.
    widths = chart_eval(page, "reward", "c.plot.series.slice(1).map((s) => s.width)")
    assert widths[0] > max(widths[1:])
    fill = chart_eval(page, "reward", "c.plot.bands[0].fill")
    assert float(fill.rsplit(",", 1)[1].rstrip(")")) <= 0.1
    # A constant (tiny-grpo's partial ratio is 0) is drawn on 0..1, not 0..100.
    scale = chart_eval(page, "partial rollouts", "[c.plot.scales.y.min, c.plot.scales.y.max]")
    assert scale == [0, 1]
    # Times carry their date.
    first = page.locator("#events li time").first.inner_text()
    assert str(datetime.now(UTC).year) in first
    page.select_option("#key-picker", "actor/pg_loss")
    page.locator("[data-chart='actor/pg_loss'] canvas").wait_for()
    events = page.locator("#events li").all_inner_texts()
    assert "accepted" in events[0] and "SUCCEEDED" in events[-1]
    assert "jobs.tiny_grpo" in page.locator("#command").inner_text()
    until(page, "document.getElementById('script').textContent.length > 0")
    assert (page.locator("#script").text_content() or "").startswith("#!/usr/bin/env bash")
    until(page, "document.getElementById('log').textContent.includes('step:')")
    assert page.locator("#cancel").is_hidden()
    shot(page, "dashboard-run.png")
    # Clone: the submit form starts from this run's spec.
    page.click("text=clone")
    until(page, "(document.getElementById('field-lr') || {}).value === '1'")
    assert page.locator("#field-name").input_value() == "tiny lr 1 (clone)"


def test_submit_is_a_form_from_the_recipe_schema_with_errors_beside_fields_and_a_json_view(
    live: Live, page: Any
) -> None:
    page.goto(f"{live.url}/ui/#/submit")
    until(page, "document.getElementById('view').dataset.ready === 'true'")
    # The form is the chosen recipe's schema: its fields, defaults and help.
    page.select_option("#recipe", "test-script")
    seconds = page.locator(".field[data-field='seconds']")
    seconds.wait_for()
    assert page.locator("#field-seconds").get_attribute("type") == "number"
    assert "default 0" in seconds.locator(".help").inner_text()
    assert page.locator("#field-priority option").all_inner_texts()[0] == "default (normal)"
    page.fill("#field-team", "Bad Team")
    page.fill("#field-seconds", "-1")
    page.locator("#field-seconds").dispatch_event("change")
    page.locator("#field-team").dispatch_event("change")
    page.click("#dry-run")
    # Each 422 is shown beside its own field.
    page.locator(".field.invalid[data-field='seconds']").wait_for()
    assert seconds.locator(".field-error").inner_text() != ""
    assert page.locator(".field[data-field='team'] .field-error").inner_text() != ""
    assert page.locator("#submit").is_disabled()
    # The JSON view is the same spec; an edit there is in the form when it comes back.
    page.click("#json-toggle")
    spec = json.loads(page.locator("#spec-json").input_value())
    assert spec == {"recipe": "test-script", "team": "Bad Team", "seconds": -1}
    page.fill("#spec-json", '{"recipe": "test-script", "name": "from the form", "npus": 2}')
    page.click("#dry-run")
    page.locator("#plan #placement tbody tr").first.wait_for()
    page.click("#json-toggle")
    assert page.locator("#field-name").input_value() == "from the form"
    assert page.locator("#field-npus").input_value() == "2"
    assert "queue position 0" in page.locator("#plan-verdict").inner_text()
    assert "python3 -c" in page.locator("#plan-command").inner_text()
    shot(page, "dashboard-submit.png")
    page.click("#submit")
    until(page, "/^#\\/runs\\/r[0-9a-f]+$/.test(location.hash)")
    run_id = page.evaluate("location.hash.split('/').pop()")
    assert httpx.get(f"{live.url}/runs/{run_id}").json()["name"] == "from the form"


def test_cluster_view_shows_nodes_holders_quotas_and_the_queue_reason(
    live: Live, page: Any
) -> None:
    page.goto(f"{live.url}/ui/#/cluster")
    page.locator("#nodes tbody tr").nth(1).wait_for()
    assert page.locator("#nodes tbody tr").count() == 2
    assert "NPU" in page.locator("#nodes").inner_text()
    page.locator(f"#active tr[data-id='{live.holder}']").wait_for()
    reason = page.locator(f"#queue tr[data-id='{live.waiting}'] .queue-reason").inner_text()
    assert reason.startswith("quota")
    assert "capped" in page.locator("#teams").inner_text()
    assert "free" in page.locator("#cluster").inner_text()  # the header's summary
    # The waiting run's page says why it waits; cancelling asks first.
    page.goto(f"{live.url}/ui/#/runs/{live.waiting}")
    page.locator("#run-queue:not([hidden])").wait_for()
    assert "quota" in page.locator("#run-queue").inner_text()
    # Nothing logged yet is said in words: no empty chart strip, table or black log box.
    assert "No metrics yet" in page.locator("#charts .empty").inner_text()
    assert "No metrics yet" in page.locator("#latest").inner_text()
    assert page.locator("#no-log").is_visible() and page.locator("#log").is_hidden()
    page.once("dialog", lambda d: d.accept())
    page.click("#cancel")
    until(page, "document.getElementById('run-status').textContent === 'CANCELLED'", timeout=30_000)


def test_compare_overlays_two_runs_and_lists_their_spec_differences(live: Live, page: Any) -> None:
    with httpx.Client(base_url=live.url) as http:
        for run_id in live.tiny:
            wait_status(http, run_id, TERMINAL, timeout=180)
    page.goto(f"{live.url}/ui/#/compare?runs={','.join(live.tiny)}")
    chart = page.locator("[data-chart='critic/score/mean']")
    chart.locator("canvas").wait_for()
    assert chart.get_attribute("data-series") == "2"
    page.locator("#spec-diff tr[data-field='lr']").wait_for()
    assert page.locator("#spec-diff tr[data-field='lr'] td").all_inner_texts() == ["lr", "2", "1"]
    assert page.locator("#spec-diff tr[data-field='name']").count() == 1
    # The table is headed by the names the legend shows; the charts take the page's width.
    until(page, "document.querySelector('#spec-diff thead').textContent.includes('tiny lr 2')")
    assert page.locator("#spec-diff thead th").all_inner_texts() == [
        "field",
        "tiny lr 2",
        "tiny lr 1",
    ]
    assert chart.bounding_box()["width"] > 0.9 * page.viewport_size["width"] - 60
    page.select_option("#compare-key", "fully_async/trainer/idle_ratio")
    page.locator("[data-chart='fully_async/trainer/idle_ratio'] canvas").wait_for()
    assert "keys=" in page.evaluate("location.hash")
    shot(page, "dashboard-compare.png")


def test_with_auth_on_the_dashboard_shows_the_tokens_team_only(tmp_path: Path, page: Any) -> None:
    users = ("ana", "vision", "member"), ("root", "ops", "admin")
    url, (member, admin) = sqlite_with_tokens(tmp_path, "ui.db", *users)
    settings = make_settings(url, "http://127.0.0.1:9", run_loops=False, auth="on")
    with ServerThread(create_app(settings)) as server:
        with httpx.Client(base_url=server) as http:
            assert http.get("/runs").status_code == 401
            ids = {
                team: http.post(
                    "/runs",
                    json={"recipe": "test-script", "team": team, "name": f"{team} run"},
                    headers={"Authorization": f"Bearer {admin}"},
                ).json()["id"]
                for team in ("vision", "audio")
            }
        # Signed in before the first call, so no 401 is logged.
        page.add_init_script(
            "localStorage.getItem('rlrun-token') ||"
            f" localStorage.setItem('rlrun-token', {member!r})"
        )
        page.goto(f"{server}/ui/#/runs")
        page.locator(f"#runs tr[data-id='{ids['vision']}']").wait_for()
        assert page.locator(f"#runs tr[data-id='{ids['audio']}']").count() == 0
        # With auth on, the page offers a sign-in; a token given there is kept and sent.
        assert page.locator("#sign-in").is_visible()
        assert page.locator("#token-state").inner_text() == "token set"
        seen: list[str | None] = []
        page.on(
            "request", lambda r: "/runs?" in r.url and seen.append(r.headers.get("authorization"))
        )
        page.fill("#token", admin)
        page.click("#sign-in button[type=submit]")
        page.locator(f"#runs tr[data-id='{ids['audio']}']").wait_for()
        assert f"Bearer {admin}" in seen
        assert page.evaluate("localStorage.getItem('rlrun-token')") == admin
