"""``metric.threshold``: rules validated at the API, evaluated as the follower stores points, one
delivery per crossing (not per step) with its state in the database, signed like any other."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy import select
from standardwebhooks import Webhook as Verifier

from service.loops.follower import Follower
from service.metrics.health import HealthRules
from service.metrics.log_readers import WholeLogReader
from service.metrics.parse import parse_line
from service.notify import formats, thresholds
from service.store.models import Run, WebhookDelivery, WebhookThreshold
from tests.factories import add_run
from tests.fake_ray import FakeRay
from tests.test_webhooks import Receiver, _notifier, api, receiver

__all__ = ["api", "receiver"]  # the fixtures, shared with the webhook tests

LOW = {"key": "critic/score/mean", "op": "<", "value": 0.1, "for_steps": 3}


def _subscribe(api: TestClient, url: str, *rules: dict[str, Any]) -> dict[str, Any]:
    body = {"url": url, "events": ["metric.threshold"], "thresholds": list(rules)}
    resp = api.post("/webhooks", json=body)
    assert resp.status_code == 201, resp.text
    hook: dict[str, Any] = resp.json()
    return hook


def _lines(start: int, values: list[float]) -> str:
    return "".join(
        f"step:{start + i} - critic/score/mean:{v} - actor/pg_loss:0.1\n"
        for i, v in enumerate(values)
    )


def _deliveries(db_url: str) -> list[WebhookDelivery]:
    db, _ = _notifier(db_url)
    with db.read() as s:
        rows = list(s.scalars(select(WebhookDelivery).order_by(WebhookDelivery.created_at)))
        s.expunge_all()
    db.dispose()
    return rows


def test_bad_threshold_rules_are_refused_with_their_field_path(api: TestClient) -> None:
    url = "http://127.0.0.1:9/x"
    for rule, field in [
        (LOW | {"op": "=="}, "thresholds[0].op"),
        (LOW | {"for_steps": 0}, "thresholds[0].for_steps"),
        (LOW | {"key": "a b"}, "thresholds[0].key"),
        (LOW | {"unknown": 1}, "thresholds[0].unknown"),
    ]:
        body = {"url": url, "events": ["metric.threshold"], "thresholds": [rule]}
        resp = api.post("/webhooks", json=body)
        assert resp.status_code == 422, rule
        assert resp.json()["errors"][0]["field"] == field
    # The event without a rule, and a rule without the event, say which field is wrong.
    for body in (
        {"url": url, "events": ["metric.threshold"]},
        {"url": url, "events": ["run.status"], "thresholds": [LOW]},
    ):
        resp = api.post("/webhooks", json=body)
        assert resp.status_code == 422 and resp.json()["errors"][0]["field"] == "thresholds"
    hook = _subscribe(api, url, LOW)
    assert hook["thresholds"] == [LOW]
    bad = api.patch(f"/webhooks/{hook['id']}", json={"thresholds": [LOW | {"op": "!="}]})
    assert bad.status_code == 422 and bad.json()["errors"][0]["field"] == "thresholds[0].op"
    gone = api.patch(f"/webhooks/{hook['id']}", json={"events": ["run.status"], "thresholds": None})
    assert gone.status_code == 200 and gone.json()["thresholds"] == []


def test_a_threshold_fires_once_per_crossing_not_per_step(
    api: TestClient, receiver: Receiver, db_url: str
) -> None:
    hook = _subscribe(api, f"{receiver.url}/in", LOW)
    db, notifier = _notifier(db_url)
    run_id, ray = add_run(db, "r1", name="geo3k"), FakeRay()
    follower = Follower(db, ray, "one", 30, 10_000, HealthRules(), reader=WholeLogReader(ray))
    # Above; below for 3 steps (fires at step 4), split across two reads so the streak is kept
    # in the database; still below for 5 more steps (quiet).
    ray.log[run_id] = _lines(0, [0.5, 0.5, 0.05])
    follower.tick()
    assert _deliveries(db_url) == []
    ray.log[run_id] += _lines(3, [0.05, 0.05, 0.02, 0.01, 0.03, 0.04, 0.05])
    follower.tick()
    assert [d.payload["threshold"]["step"] for d in _deliveries(db_url)] == [4]
    # Clears; below for only 2 steps (not long enough); clears; below for 3: fires again.
    ray.log[run_id] += _lines(10, [0.5, 0.05, 0.05, 0.6, 0.01, 0.02, 0.03, 0.04])
    follower.tick()
    fired = _deliveries(db_url)
    assert [d.payload["threshold"]["step"] for d in fired] == [4, 16]
    # Lines evaluated again (a log re-read) tell nothing twice.
    again = [m for line in ray.log[run_id].splitlines() if (m := parse_line(line))]
    with db.transaction() as s:
        run = s.get(Run, run_id)
        assert run is not None
        assert thresholds.evaluate(s, run, again, thresholds.listening(s)) == 0
    assert len(_deliveries(db_url)) == 2
    notifier.tick()
    assert len(receiver.requests) == 2
    msgs = [Verifier(hook["secret"]).verify(b, h) for _, h, b in receiver.requests]
    msg = min(msgs, key=lambda m: m["data"]["threshold"]["step"])  # sent side by side
    assert msg["type"] == "metric.threshold"
    assert msg["data"]["run"]["id"] == "r1"
    assert msg["data"]["threshold"] == {
        "key": "critic/score/mean",
        "value": 0.05,
        "step": 4,
        "rule": LOW,
    }
    db.dispose()


def test_a_crossing_is_stored_with_its_points_and_a_changed_rule_starts_afresh(
    api: TestClient, db_url: str
) -> None:
    hook = _subscribe(api, "http://127.0.0.1:9/x", LOW | {"for_steps": 1})
    db, _ = _notifier(db_url)
    run_id, ray = add_run(db, "r1"), FakeRay()
    follower = Follower(db, ray, "one", 30, 10_000, HealthRules(), reader=WholeLogReader(ray))
    ray.log[run_id] = _lines(0, [0.01])
    follower.tick()
    with db.read() as s:
        state = s.scalars(select(WebhookThreshold)).one()
        assert (state.fired, state.streak, state.last_step) == (True, 1, 0)
    assert len(_deliveries(db_url)) == 1
    higher = LOW | {"value": 0.5, "for_steps": 1}
    assert api.patch(f"/webhooks/{hook['id']}", json={"thresholds": [higher]}).status_code == 200
    with db.read() as s:
        assert s.scalars(select(WebhookThreshold)).all() == []
    db.dispose()


def test_a_crossing_reads_as_one_line_in_slack() -> None:
    payload = {
        "run": {"id": "r1", "name": "geo3k", "team": "vision", "recipe": "verl-grpo"},
        "threshold": {"key": "critic/score/mean", "value": 0.05, "step": 40, "rule": LOW},
    }
    msg = formats.slack("metric.threshold", payload, "http://rlrun.example/#/runs/r1")
    text = "rlrun: geo3k: critic/score/mean = 0.05 at step 40 (&lt; 0.1 for 3 steps)"
    assert msg["text"] == text  # mrkdwn-escaped
    assert [b["type"] for b in msg["blocks"]] == ["section", "context"]
