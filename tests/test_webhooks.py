"""Webhooks: subscriptions per team, the outbox written with each event, Standard Webhooks
signatures a receiver verifies with the ``standardwebhooks`` package, retries, redirects and
calls into the service's own network refused, Slack's message shape."""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select, update
from standardwebhooks import Webhook as Verifier
from standardwebhooks.webhooks import WebhookVerificationError

from service.app import create_app
from service.backoff import Backoff
from service.clock import utcnow
from service.notify.guard import AllowList, UnsafeUrl, check
from service.notify.sender import Notifier
from service.store.db import Database, upgrade
from service.store.lifecycle import set_health, transition
from service.store.models import Run, Webhook, WebhookDelivery
from service.store.status import RunStatus
from service.store.tokens import create as create_token
from tests.conftest import make_settings
from tests.factories import add_run, migrated_with_tokens

LOCAL = AllowList.parse(["127.0.0.1/32"])


def _resolver(table: dict[str, str]) -> Any:
    return lambda host, port: [table[host]]


@pytest.mark.parametrize(
    ("url", "resolves_to"),
    [
        ("http://127.0.0.1:9/hook", "127.0.0.1"),
        ("http://metadata.example/latest", "169.254.169.254"),
        ("https://intranet.example/hook", "10.1.2.3"),
        ("http://shared.example/", "100.64.0.7"),
        ("http://mapped.example/", "::ffff:127.0.0.1"),
        ("http://v6.example/", "::1"),
        ("http://zero.example/", "0.0.0.0"),
        # IPv6 forms that carry a loopback or private IPv4 address, and site-local IPv6.
        ("http://[64:ff9b::7f00:1]:9/", "64:ff9b::7f00:1"),  # NAT64
        ("http://nat64.example/", "64:ff9b::a00:5"),
        ("http://local-nat64.example/", "64:ff9b:1::a00:5"),  # local-use NAT64
        ("http://6to4.example/", "2002:7f00:1::1"),
        ("http://6to4-private.example/", "2002:c0a8:101::1"),
        ("http://compatible.example/", "::127.0.0.1"),
        ("http://translated.example/", "::ffff:0:127.0.0.1"),
        ("http://teredo.example/", "2001:0:4136:e378:8000:63bf:f5ff:fffe"),  # client 10.0.0.1
        ("http://site-local.example/", "fec0::1"),
    ],
)
def test_urls_into_the_service_s_own_networks_are_refused(url: str, resolves_to: str) -> None:
    host = urlsplit(url).hostname or ""
    with pytest.raises(UnsafeUrl, match="RLRUN_WEBHOOK_ALLOW"):
        check(url, AllowList.parse([]), _resolver({host: resolves_to}))


def test_only_http_urls_without_credentials_and_allowed_hosts_pass() -> None:
    public = _resolver({"hooks.example": "93.184.216.34", "internal.example": "10.0.0.5"})
    assert check("https://hooks.example/x", AllowList.parse([]), public).address == "93.184.216.34"
    # A NAT64 address of a public IPv4 address is public.
    nat64 = _resolver({"v6.hooks.example": "64:ff9b::5db8:d822"})
    assert check("https://v6.hooks.example/", AllowList.parse([]), nat64)
    for bad in ("ftp://hooks.example/", "https://user:pw@hooks.example/", "http:///nohost"):
        with pytest.raises(UnsafeUrl):
            check(bad, AllowList.parse([]), public)
    # The operator's allow-list admits a name or a network, and nothing else.
    assert check("http://internal.example/", AllowList.parse(["internal.example"]), public)
    assert check("http://internal.example/", AllowList.parse(["10.0.0.0/8"]), public)
    with pytest.raises(UnsafeUrl):
        check("http://internal.example/", AllowList.parse(["10.9.0.0/16"]), public)


class Receiver:
    """A local HTTP receiver: records each request; answers with the statuses scripted."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, dict[str, str], bytes]] = []
        self.script: list[tuple[int, dict[str, str]]] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["content-length"]))
                receiver.requests.append((self.path, dict(self.headers), body))
                status, headers = receiver.script.pop(0) if receiver.script else (200, {})
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("content-length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


@pytest.fixture
def api(db_url: str) -> Iterator[TestClient]:
    settings = make_settings(
        db_url, "http://127.0.0.1:9", run_loops=False, webhook_allow="127.0.0.1/32"
    )
    with TestClient(create_app(settings)) as client:
        yield client


def _notifier(db_url: str, **kw: Any) -> tuple[Database, Notifier]:
    upgrade(db_url)
    db = Database(db_url)
    kw.setdefault("backoff", Backoff(0.01, 0.01))
    return db, Notifier(db, "test", LOCAL, "http://rlrun.example", timeout_s=5, **kw)


def _fail(db: Database, run_id: str) -> None:
    with db.transaction() as s:
        run = s.get(Run, run_id)
        assert run is not None
        transition(s, run, RunStatus.FAILED, "the job failed")


def _subscribe(api: TestClient, url: str, **rules: Any) -> dict[str, Any]:
    resp = api.post("/webhooks", json={"url": url, "events": ["run.status"], **rules})
    assert resp.status_code == 201, resp.text
    hook: dict[str, Any] = resp.json()
    return hook


def test_an_event_reaches_the_receiver_signed_and_a_tampered_body_does_not_verify(
    api: TestClient, receiver: Receiver, db_url: str
) -> None:
    hook = _subscribe(api, f"{receiver.url}/in")
    assert hook["secret"].startswith("whsec_")
    assert "secret" not in api.get("/webhooks").json()[0]
    db, notifier = _notifier(db_url)
    add_run(db, "r1", RunStatus.RUNNING, name="geo3k <!channel>")
    _fail(db, "r1")
    notifier.tick()
    assert len(receiver.requests) == 1  # run.status (run.failed waits for the log: explain)
    path, headers, body = receiver.requests[0]
    assert path == "/in"
    msg = Verifier(hook["secret"]).verify(body, headers)
    assert msg["type"] == "run.status"
    assert msg["data"]["run"]["id"] == "r1" and msg["data"]["event"]["to"] == "FAILED"
    assert msg["data"]["url"] == "http://rlrun.example/#/runs/r1"
    with pytest.raises(WebhookVerificationError):
        Verifier(hook["secret"]).verify(body.replace(b"FAILED", b"SUCCEEDED"), headers)
    old = headers | {"webhook-timestamp": str(int(utcnow().timestamp()) - 3600)}
    with pytest.raises(WebhookVerificationError):
        Verifier(hook["secret"]).verify(body, old)
    deliveries = api.get(f"/webhooks/{hook['id']}/deliveries").json()
    assert {d["state"] for d in deliveries} == {"delivered"}
    assert deliveries[0]["attempts"][0]["status_code"] == 200
    db.dispose()


def test_a_closed_notifier_leaves_no_send_thread_and_no_kept_connection(
    api: TestClient, receiver: Receiver, db_url: str
) -> None:
    _subscribe(api, f"{receiver.url}/in")
    db, notifier = _notifier(db_url)
    add_run(db, "r1", RunStatus.RUNNING)
    _fail(db, "r1")
    notifier.tick()
    assert len(receiver.requests) == 1
    senders = [t for t in threading.enumerate() if t.name.startswith("notifier")]
    assert senders and notifier._clients
    notifier.close()
    assert not any(t.is_alive() for t in senders)
    assert not notifier._clients
    db.dispose()


def test_a_failed_call_is_retried_with_the_same_webhook_id_and_a_redirect_is_not_followed(
    api: TestClient, receiver: Receiver, db_url: str
) -> None:
    hook = _subscribe(api, f"{receiver.url}/in")
    db, notifier = _notifier(db_url)
    add_run(db, "r1")
    receiver.script = [(500, {}), (302, {"location": f"{receiver.url}/elsewhere"})]
    _fail(db, "r1")
    for _ in range(3):
        notifier.tick()
        with db.transaction() as s:  # no waiting for the backoff in a test
            s.execute(update(WebhookDelivery).values(next_attempt_at=utcnow()))
    ids = [h["webhook-id"] for _, h, _ in receiver.requests]
    assert len(ids) == 3 and len(set(ids)) == 1
    assert [p for p, _, _ in receiver.requests] == ["/in"] * 3  # never /elsewhere
    attempts = api.get(f"/webhooks/{hook['id']}/deliveries").json()[0]["attempts"]
    assert [a["status_code"] for a in attempts] == [500, 302, 200]
    assert "not followed" in attempts[1]["error"]
    db.dispose()


def test_after_the_retry_window_a_delivery_fails_and_its_subscription_pauses(
    api: TestClient, db_url: str
) -> None:
    hook = _subscribe(api, "http://127.0.0.1:9/nothing-listens")
    db, notifier = _notifier(db_url, max_age_s=0.001)
    add_run(db, "r1")
    _fail(db, "r1")
    notifier.tick()
    with db.read() as s:
        assert s.scalar(select(WebhookDelivery.state)) == "failed"
    paused = api.get(f"/webhooks/{hook['id']}").json()
    assert paused["paused_at"] is not None and "failed" in paused["paused_reason"]
    # Paused: new events are not queued for it; resumed, they are.
    add_run(db, "r2")
    _fail(db, "r2")
    with db.read() as s:
        assert s.scalar(select(WebhookDelivery.id).where(WebhookDelivery.run_id == "r2")) is None
    assert api.patch(f"/webhooks/{hook['id']}", json={"paused": False}).json()["paused_at"] is None
    db.dispose()


def test_filters_choose_the_events_and_runs_a_subscription_hears_of(
    api: TestClient, db_url: str
) -> None:
    _subscribe(api, "http://127.0.0.1:9/a", statuses=["FAILED"], name_pattern="geo3k-*")
    _subscribe(api, "http://127.0.0.1:9/b", events=["run.health"])
    db, _ = _notifier(db_url)
    add_run(db, "r1", RunStatus.SUBMITTED, name="geo3k-8b")
    add_run(db, "r2", RunStatus.RUNNING, name="dapo")
    with db.transaction() as s:
        r1, r2 = s.get(Run, "r1"), s.get(Run, "r2")
        assert r1 is not None and r2 is not None
        transition(s, r1, RunStatus.RUNNING, "started")  # not FAILED: nothing for /a
        transition(s, r1, RunStatus.FAILED, "x")  # /a
        transition(s, r2, RunStatus.FAILED, "x")  # not geo3k-*: nothing
        set_health(s, r2, "stalled", "no step")  # /b
    with db.read() as s:
        sent = sorted(
            (hook_url, d.run_id, d.event_type)
            for d, hook_url in s.execute(
                select(WebhookDelivery, Webhook.url).join(Webhook)
            ).tuples()
        )
    assert [(u[-1], r, t) for u, r, t in sent] == [
        ("a", "r1", "run.status"),
        ("b", "r2", "run.health"),
    ]
    db.dispose()


def test_a_slack_message_has_slack_s_block_shape_and_escapes_names(
    api: TestClient, receiver: Receiver, db_url: str
) -> None:
    _subscribe(api, f"{receiver.url}/slack", format="slack")
    db, notifier = _notifier(db_url)
    add_run(db, "r1", name="evil <!channel> & <http://x|y>")
    _fail(db, "r1")
    notifier.tick()
    message = json.loads(receiver.requests[0][2])
    assert message["text"].startswith("rlrun: ")
    section, context = message["blocks"]
    assert section["type"] == "section" and section["text"]["type"] == "mrkdwn"
    assert context["type"] == "context" and context["elements"][0]["type"] == "mrkdwn"
    assert "<http://rlrun.example/#/runs/r1|" in section["text"]["text"]
    assert "<!channel>" not in json.dumps(message) and "&lt;!channel&gt;" in section["text"]["text"]
    db.dispose()


def test_a_rotated_secret_and_its_predecessor_both_sign_during_the_overlap(
    api: TestClient, receiver: Receiver, db_url: str
) -> None:
    hook = _subscribe(api, f"{receiver.url}/in")
    rotated = api.post(f"/webhooks/{hook['id']}/rotate", json={"overlap_s": 3600}).json()
    assert rotated["secret"] != hook["secret"] and rotated["previous_valid_until"]
    db, notifier = _notifier(db_url)
    add_run(db, "r1")
    _fail(db, "r1")
    notifier.tick()
    _, headers, body = receiver.requests[0]
    assert len(headers["webhook-signature"].split(" ")) == 2
    Verifier(rotated["secret"]).verify(body, headers)
    Verifier(hook["secret"]).verify(body, headers)
    db.dispose()


def test_subscriptions_are_a_team_s_own(db_url: str) -> None:
    settings = make_settings(
        db_url, "http://127.0.0.1:9", run_loops=False, auth="on", webhook_allow="127.0.0.1/32"
    )
    db = Database(db_url)
    with TestClient(create_app(settings)) as api:
        with db.transaction() as s:
            tokens = {
                name: create_token(s, name, team, role)[1]  # type: ignore[arg-type]
                for name, team, role in [
                    ("ann", "vision", "member"),
                    ("bob", "speech", "member"),
                    ("val", "vision", "viewer"),
                    ("cat", "vision", "member"),
                    ("root", "ops", "admin"),
                ]
            }

        def as_(who: str) -> dict[str, str]:
            return {"Authorization": f"Bearer {tokens[who]}"}

        body = {"url": "http://127.0.0.1:9/x", "events": ["run.status"]}
        mine = api.post("/webhooks", json=body, headers=as_("ann"))
        assert mine.status_code == 201 and mine.json()["team"] == "vision"
        hook_id = mine.json()["id"]
        assert api.post("/webhooks", json=body, headers=as_("val")).status_code == 403
        other_team = body | {"team": "speech"}
        assert api.post("/webhooks", json=other_team, headers=as_("ann")).status_code == 403
        assert api.get(f"/webhooks/{hook_id}", headers=as_("bob")).status_code == 404
        assert api.delete(f"/webhooks/{hook_id}", headers=as_("bob")).status_code == 404
        assert api.get("/webhooks", headers=as_("bob")).json() == []
        assert [h["id"] for h in api.get("/webhooks", headers=as_("val")).json()] == [hook_id]
        # A Slack URL's path is the key to its channel: only the maker and admins read it.
        assert api.get(f"/webhooks/{hook_id}", headers=as_("ann")).json()["url"] == body["url"]
        assert api.get(f"/webhooks/{hook_id}", headers=as_("root")).json()["url"] == body["url"]
        for seen in (
            api.get(f"/webhooks/{hook_id}", headers=as_("val")).json(),
            api.get(f"/webhooks/{hook_id}", headers=as_("cat")).json(),
            api.get("/webhooks", headers=as_("val")).json()[0],
        ):
            assert seen["url"] == "http://127.0.0.1:9/…"
        everyone = api.post("/webhooks", json=body, headers=as_("root")).json()
        assert everyone["team"] is None  # an admin's: every team's runs
        unsafe = api.post(
            "/webhooks", json=body | {"url": "http://169.254.169.254/"}, headers=as_("ann")
        )
        assert unsafe.status_code == 422 and unsafe.json()["errors"][0]["field"] == "url"
        actions = [a["action"] for a in api.get("/audit", headers=as_("root")).json()["items"]]
        assert actions.count("webhook.create") == 2
    db.dispose()


def test_deliveries_are_written_in_the_event_s_transaction(api: TestClient, db_url: str) -> None:
    _subscribe(api, "http://127.0.0.1:9/x")
    db, _ = _notifier(db_url)
    add_run(db, "r1")
    with pytest.raises(RuntimeError), db.transaction() as s:
        run = s.get(Run, "r1")
        assert run is not None
        transition(s, run, RunStatus.FAILED, "x")
        raise RuntimeError("the event's transaction rolls back")
    with db.read() as s:
        assert s.scalar(select(WebhookDelivery.id)) is None
        assert s.get(Run, "r1").status == RunStatus.RUNNING  # type: ignore[union-attr]
    db.dispose()


def test_a_name_that_resolves_elsewhere_by_the_time_of_sending_is_not_called(
    api: TestClient, receiver: Receiver, db_url: str
) -> None:
    hook = _subscribe(api, f"{receiver.url}/in")
    # Checked when subscribed; by the time of sending the name points into the network.
    db, notifier = _notifier(db_url, resolve=_resolver({"127.0.0.1": "10.0.0.1"}))
    notifier.allow = AllowList.parse([])
    add_run(db, "r1")
    _fail(db, "r1")
    notifier.tick()
    assert receiver.requests == []
    attempt = api.get(f"/webhooks/{hook['id']}/deliveries").json()[0]["attempts"][0]
    assert attempt["status_code"] is None and attempt["error"].startswith("refused")
    db.dispose()


@contextlib.contextmanager
def _served(db_url: str) -> Iterator[tuple[Any, Any, list[str]]]:
    """The service (loopback webhooks allowed) and the rlrun command pointed at it."""
    from typer.testing import CliRunner

    from service.cli import app as cli
    from tests.live import ServerThread

    settings = make_settings(
        db_url, "http://127.0.0.1:9", run_loops=False, webhook_allow="127.0.0.1/32"
    )
    with ServerThread(create_app(settings)) as url:
        yield CliRunner(), cli, ["--server", url]


def test_the_cli_adds_lists_and_removes_subscriptions(db_url: str) -> None:
    with _served(db_url) as (runner, cli, server):
        added = runner.invoke(
            cli,
            ["webhook", "add", "http://127.0.0.1:9/x", "--event", "run.failed", "--slack", *server],
        )
        assert added.exit_code == 0, added.output
        hook_id = added.stdout.strip().splitlines()[0]
        assert hook_id.startswith("whk_") and "whsec_" in added.stderr
        listed = json.loads(runner.invoke(cli, ["webhook", "list", "-o", "json", *server]).stdout)
        assert [(h["id"], h["events"], h["format"]) for h in listed] == [
            (hook_id, ["run.failed"], "slack")
        ]
        refused = runner.invoke(cli, ["webhook", "add", "http://10.0.0.1/x", *server])
        assert refused.exit_code == 3 and "url" in refused.stderr
        rule = ["--threshold", "critic/score/mean < 0.1 for 20"]
        low = runner.invoke(cli, ["webhook", "add", "http://127.0.0.1:9/y", *rule, *server])
        assert low.exit_code == 0, low.output
        low_id = low.stdout.strip().splitlines()[0]
        listed = json.loads(runner.invoke(cli, ["webhook", "list", "-o", "json", *server]).stdout)
        assert [(h["events"], h["thresholds"]) for h in listed if h["id"] == low_id] == [
            (
                ["metric.threshold"],
                [{"key": "critic/score/mean", "op": "<", "value": 0.1, "for_steps": 20}],
            )
        ]
        assert runner.invoke(cli, ["webhook", "rm", low_id, *server]).exit_code == 0
        assert runner.invoke(cli, ["webhook", "rm", hook_id, *server]).exit_code == 0
        assert (
            json.loads(runner.invoke(cli, ["webhook", "list", "-o", "json", *server]).stdout) == []
        )


def test_a_subscription_shows_its_newest_attempt_and_the_failures_since_its_last_success(
    api: TestClient, receiver: Receiver, db_url: str
) -> None:
    hook = _subscribe(api, f"{receiver.url}/in")
    quiet = _subscribe(api, f"{receiver.url}/quiet", statuses=["LOST"])
    # One attempt a tick: a retry falls due only when the test says so, not within the tick.
    db, notifier = _notifier(db_url, backoff=Backoff(60.0, 60.0))
    receiver.script = [(500, {}), (503, {}), (200, {}), (500, {})]

    def standing() -> tuple[int | None, int]:
        shown = api.get(f"/webhooks/{hook['id']}").json()
        listed = {h["id"]: h for h in api.get("/webhooks").json()}[hook["id"]]
        assert (listed["last_attempt"], listed["failures"]) == (
            shown["last_attempt"],
            shown["failures"],
        )
        return shown["last_attempt"]["status_code"], shown["failures"]

    add_run(db, "r1")
    _fail(db, "r1")
    for expected in [(500, 1), (503, 2), (200, 0)]:
        notifier.tick()
        with db.transaction() as s:  # no waiting for the backoff in a test
            s.execute(update(WebhookDelivery).values(next_attempt_at=utcnow()))
        assert standing() == expected
    add_run(db, "r2")
    _fail(db, "r2")
    notifier.tick()
    assert standing() == (500, 1)
    untried = api.get(f"/webhooks/{quiet['id']}").json()
    assert (untried["last_attempt"], untried["failures"]) == (None, 0)
    db.dispose()


def test_whoami_names_the_token_s_user_team_and_role(db_url: str) -> None:
    [viewer] = migrated_with_tokens(db_url, ("vic", "vision", "viewer"))
    settings = make_settings(db_url, "http://127.0.0.1:9", run_loops=False, auth="on")
    with TestClient(create_app(settings)) as client:
        me = client.get("/whoami", headers={"Authorization": f"Bearer {viewer}"}).json()
        assert me == {"user": "vic", "team": "vision", "role": "viewer", "auth": True}
        assert client.get("/whoami").status_code == 401


def test_the_cli_edits_a_subscription_s_thresholds_and_pauses_and_resumes_it(db_url: str) -> None:
    with _served(db_url) as (runner, cli, server):

        def shown(hook_id: str) -> dict[str, Any]:
            out = runner.invoke(cli, ["webhook", "list", "-o", "json", *server]).stdout
            return next(h for h in json.loads(out) if h["id"] == hook_id)

        def edit(*args: str) -> Any:
            return runner.invoke(cli, ["webhook", "edit", *args, *server])

        added = runner.invoke(cli, ["webhook", "add", "http://127.0.0.1:9/x", *server])
        hook_id = added.stdout.strip().splitlines()[0]
        done = edit(hook_id, "--threshold", "critic/score/mean < 0.1 for 20", "--threshold", "a>=2")
        assert done.exit_code == 0, done.output
        assert "critic/score/mean < 0.1 for 20; a >= 2 for 1; active" in done.output
        hook = shown(hook_id)
        assert hook["events"] == ["run.status", "metric.threshold"]
        assert hook["thresholds"] == [
            {"key": "critic/score/mean", "op": "<", "value": 0.1, "for_steps": 20},
            {"key": "a", "op": ">=", "value": 2.0, "for_steps": 1},
        ]
        # The rules given replace the rules there were; the events stay as they are.
        assert edit(hook_id, "--threshold", "b > 1 for 3").exit_code == 0
        hook = shown(hook_id)
        assert hook["events"] == ["run.status", "metric.threshold"]
        assert hook["thresholds"] == [{"key": "b", "op": ">", "value": 1.0, "for_steps": 3}]
        assert edit(hook_id, "--no-thresholds").exit_code == 0
        assert (shown(hook_id)["events"], shown(hook_id)["thresholds"]) == (["run.status"], [])
        assert edit(hook_id, "--pause").exit_code == 0
        assert shown(hook_id)["paused_reason"] == "paused by anonymous"
        assert "active" in edit(hook_id, "--resume").output
        assert shown(hook_id)["paused_at"] is None
        # Refused by the CLI (not a rule), by the service (no event left), or not found.
        assert edit(hook_id, "--threshold", "b is big").exit_code == 2
        assert edit(hook_id).exit_code == 2
        only = runner.invoke(
            cli, ["webhook", "add", "http://127.0.0.1:9/y", "--threshold", "c<1", *server]
        )
        only_id = only.stdout.strip().splitlines()[0]
        refused = edit(only_id, "--no-thresholds")
        assert refused.exit_code == 3 and "events" in refused.stderr
        assert shown(only_id)["thresholds"] == [
            {"key": "c", "op": "<", "value": 1.0, "for_steps": 1}
        ]
        assert edit("whk_nothere", "--pause").exit_code != 0
        table = runner.invoke(cli, ["webhook", "list", *server], env={"COLUMNS": "200"}).stdout
        assert "failures" in table and only_id in table
