"""Metrics reads over HTTP on SQLite and PostgreSQL: history, latest, logs, events, /metrics."""

from __future__ import annotations

import math
from typing import Any

from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from service.app import create_app
from service.client import parse_sse
from service.metrics import logcopy, store
from service.metrics.keys import STEP_KEY
from service.metrics.parse import MetricLine
from service.store.db import Database
from service.store.models import RunLog, utcnow
from tests.conftest import make_settings, wait_for


def queued_run(api: TestClient) -> str:
    resp = api.post("/runs", json={"recipe": "tiny-grpo", "total_rollout_steps": 160})
    assert resp.status_code == 201, resp.text
    run_id: str = resp.json()["id"]
    return run_id


def seed(db_url: str, run_id: str) -> None:
    db = Database(db_url)
    lines = [
        (
            100 * step,
            MetricLine(
                step,
                {
                    "critic/score/mean": step / 10,
                    "fully_async/count/current_param_version": float(step),
                    "training/global_step": 2.0 * step,
                    "actor/pg_loss": math.nan if step == 3 else 0.1,
                },
            ),
        )
        for step in range(1, 4)
    ]
    with db.transaction() as s:
        store.add_lines(s, run_id, lines)
        logcopy.append(s, run_id, 0, "one\ntwo\nthree\n", 1000)
        s.add(RunLog(run_id=run_id, log_offset=14, finished_at=utcnow()))
    db.dispose()


def sse(text: str) -> list[dict[str, Any]]:
    """A whole event stream, read by the same parser as the CLI's."""
    return [
        {"event": e.kind, "data": e.data, "id": e.id} for e in parse_sse([*text.splitlines(), ""])
    ]


def test_a_run_shows_progress_and_latest_metrics_with_nan_as_a_string(
    api: TestClient, db_url: str
) -> None:
    run_id = queued_run(api)
    seed(db_url, run_id)
    run = api.get(f"/runs/{run_id}").json()
    assert run["progress"] == {"step": 3, "total_steps": 10, "trainer_step": 6, "key": STEP_KEY}
    assert run["metrics"]["step"] == 3
    assert run["metrics"]["latest"]["critic/score/mean"] == 0.3
    assert "actor/pg_loss" not in run["metrics"]["latest"]
    series = api.get(f"/runs/{run_id}/metrics", params={"keys": "actor/pg_loss"}).json()
    assert series["series"]["actor/pg_loss"][-1] == {
        "step": 3,
        "value": "NaN",
        "min": "NaN",
        "max": "NaN",
    }


def test_history_honours_keys_and_step_range_and_rejects_a_reversed_range(
    api: TestClient, db_url: str
) -> None:
    run_id = queued_run(api)
    seed(db_url, run_id)
    params: dict[str, str | int] = {"keys": "critic/score/mean", "from_step": 2, "to_step": 3}
    got = api.get(f"/runs/{run_id}/metrics", params=params).json()
    assert [p["step"] for p in got["series"]["critic/score/mean"]] == [2, 3]
    assert list(got["series"]) == ["critic/score/mean"]
    bad = api.get(f"/runs/{run_id}/metrics", params={"from_step": 3, "to_step": 1})
    assert bad.status_code == 422
    assert bad.json()["errors"][0]["field"] == "query.to_step"
    assert api.get("/runs/nope/metrics").status_code == 404


def test_logs_tail_comes_from_the_services_own_copy(api: TestClient, db_url: str) -> None:
    run_id = queued_run(api)
    seed(db_url, run_id)
    assert api.get(f"/runs/{run_id}/logs", params={"tail": 2}).text == "two\nthree\n"
    assert api.get(f"/runs/{run_id}/logs").text == "one\ntwo\nthree\n"
    assert api.get("/runs/nope/logs").status_code == 404


def test_logs_read_on_from_an_offset_without_colour_codes_unless_asked(
    api: TestClient, db_url: str
) -> None:
    run_id = queued_run(api)
    db = Database(db_url)
    with db.transaction() as s:
        logcopy.append(s, run_id, 0, "\x1b[36m(Trainer pid=1)\x1b[0m one\n", 1000)
    first = api.get(f"/runs/{run_id}/logs")
    assert first.text == "(Trainer pid=1) one\n"
    assert first.headers["Log-Complete"] == "false"
    end = int(first.headers["Log-Offset"])
    assert end == len("\x1b[36m(Trainer pid=1)\x1b[0m one\n")
    with db.transaction() as s:
        logcopy.append(s, run_id, end, "two \x1b]0;title\x07\x1b[1mbold\x1b[0m\n", 1000)
    db.dispose()
    more = api.get(f"/runs/{run_id}/logs", params={"offset": end})
    assert more.text == "two bold\n"
    again = api.get(f"/runs/{run_id}/logs", params={"offset": more.headers["Log-Offset"]})
    assert again.text == "" and again.headers["Log-Offset"] == more.headers["Log-Offset"]
    raw = api.get(f"/runs/{run_id}/logs", params={"offset": end + 4, "ansi": "true"})
    assert raw.text == "\x1b]0;title\x07\x1b[1mbold\x1b[0m\n"
    api.post(f"/runs/{run_id}/cancel")
    # Cancelled before it reached Ray: no log will ever come.
    assert api.get(f"/runs/{run_id}/logs").headers["Log-Complete"] == "true"


def test_runs_list_carries_progress_and_reward_and_keys_are_listed(
    api: TestClient, db_url: str
) -> None:
    run_id, other = queued_run(api), queued_run(api)
    seed(db_url, run_id)
    items = {r["id"]: r for r in api.get("/runs").json()["items"]}
    assert items[run_id]["progress"] == {
        "step": 3,
        "total_steps": 10,
        "trainer_step": 6,
        "key": STEP_KEY,
    }
    assert items[run_id]["reward"] == 0.3
    assert items[other]["reward"] is None and items[other]["progress"]["step"] is None
    assert api.get(f"/runs/{run_id}/metrics/keys").json() == [
        "actor/pg_loss",
        "critic/score/mean",
        "fully_async/count/current_param_version",
        "training/global_step",
    ]


def test_the_event_stream_of_an_ended_run_replays_and_resumes_after_last_event_id(
    api: TestClient, db_url: str
) -> None:
    run_id = queued_run(api)
    seed(db_url, run_id)
    api.post(f"/runs/{run_id}/cancel")
    events = sse(api.get(f"/runs/{run_id}/events").text)
    kinds = [e["event"] for e in events]
    assert kinds == ["status", "status", "metrics", "metrics", "metrics", "end"]
    assert [e["data"]["step"] for e in events if e["event"] == "metrics"] == [1, 2, 3]
    assert events[4]["data"]["values"]["actor/pg_loss"] == "NaN"
    resumed = sse(
        api.get(f"/runs/{run_id}/events", headers={"Last-Event-ID": events[2]["id"]}).text
    )
    assert resumed == events[3:]
    # From now: nothing stored is replayed, the stream only ends.
    assert [e["event"] for e in sse(api.get(f"/runs/{run_id}/events?since=now").text)] == ["end"]
    assert api.get("/runs/nope/events").status_code == 404


def test_a_status_event_is_the_same_json_in_the_run_and_on_its_stream(api: TestClient) -> None:
    run_id = queued_run(api)
    api.post(f"/runs/{run_id}/cancel")
    streamed = [e["data"] for e in sse(api.get(f"/runs/{run_id}/events").text)]
    stored = api.get(f"/runs/{run_id}").json()["events"]
    assert streamed[: len(stored)] == stored and len(stored) == 2
    assert all(e["at"].endswith("Z") for e in stored)


def scrape(api: TestClient) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """``/metrics`` read by Prometheus' own parser: sample name -> labels -> value."""
    resp = api.get("/metrics")
    assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/plain")
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(resp.text):
        for sample in family.samples:
            out.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return out


def test_prometheus_text_counts_runs_by_status(api: TestClient) -> None:
    run_id = queued_run(api)
    api.get(f"/runs/{run_id}")
    api.get("/runs/nope")
    found = scrape(api)
    assert found["rlrun_runs"][(("status", "QUEUED"),)] == 1
    assert found["rlrun_runs"][(("status", "LOST"),)] == 0
    assert found["rlrun_event_streams"] == {(): 0}
    # The door (32 request threads: up to 64 in, 16 at first): the scrape itself is in.
    assert 4 <= found["rlrun_requests_let_in"][()] <= 64
    assert found["rlrun_requests_in"] == {(): 1}
    assert found["rlrun_event_loop_lag_seconds"][()] >= 0
    assert (
        found["rlrun_accepts_written_total"] == found["rlrun_accept_transactions_total"] == {(): 1}
    )
    # Request latency by route template (an id makes no series of its own), method and status.
    counts = found["rlrun_http_request_duration_seconds_count"]
    assert counts[(("method", "GET"), ("route", "/runs/{run_id}"), ("status", "200"))] == 1
    assert counts[(("method", "GET"), ("route", "/runs/{run_id}"), ("status", "404"))] == 1
    assert counts[(("method", "POST"), ("route", "/runs"), ("status", "201"))] == 1
    assert not [labels for labels in counts if run_id in str(labels)]


def test_prometheus_names_of_the_loops_and_follower_with_tick_durations(db_url: str) -> None:
    settings = make_settings(db_url, "http://127.0.0.1:9", follow_interval_s=0.2)
    with TestClient(create_app(settings)) as api:
        loops = set(api.app.state.services.loops)  # type: ignore[attr-defined]
        found = wait_for(
            lambda: scrape(api),
            lambda f: (
                all(v > 0 for v in f["rlrun_loop_tick_duration_seconds_count"].values())
                and len(f["rlrun_loop_tick_duration_seconds_count"]) == len(loops)
            ),
            timeout=60,
        )
    assert {"submitter", "reconciler", "watchdog", "follower", "notifier"} <= loops
    assert {dict(k)["loop"] for k in found["rlrun_loop_ticks_total"]} == loops
    assert {dict(k)["loop"] for k in found["rlrun_loop_tick_duration_seconds_bucket"]} == loops
    for name in (
        "rlrun_metric_points_ingested_total",
        "rlrun_followed_runs",
        "rlrun_follower_lag_seconds",
    ):
        assert found[name] == {(): 0}, name


def test_a_replay_longer_than_one_bounded_read_misses_no_line(api: TestClient, db_url: str) -> None:
    run_id = queued_run(api)
    seed(db_url, run_id)
    db = Database(db_url)
    lines = [
        (1000 + i, MetricLine(10 + i, {f"k/{k}": float(k) for k in range(60)})) for i in range(150)
    ]
    with db.transaction() as s:
        store.add_lines(s, run_id, lines)  # 9,000 points: more than one read returns
    db.dispose()
    api.post(f"/runs/{run_id}/cancel")
    events = sse(api.get(f"/runs/{run_id}/events").text)
    steps = [e["data"]["step"] for e in events if e["event"] == "metrics"]
    assert steps == [1, 2, 3, *range(10, 160)]
    assert events[-1]["event"] == "end"
