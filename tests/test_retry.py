"""Retries as attempts of one run, against Ray in memory (the loops are real): a policy starts
the next attempt as its own Ray job once the failure class is known; by hand from checkpoint
or scratch; a cancel stops every later attempt; a later attempt's points replace the earlier
ones from the step it resumed at, so the run keeps one history."""

from __future__ import annotations

import json
import threading
import time
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from service.cluster.inventory_cache import InventoryCache
from service.cluster.ray_jobs import RayUnavailable
from service.loops.follower import DECIDE_WITHIN, Follower
from service.loops.reconciler import Reconciler
from service.loops.submitter import Submitter
from service.metrics.health import HealthRules
from service.metrics.log_readers import WholeLogReader
from service.notify.formats import headline
from service.notify.guard import AllowList
from service.notify.sender import Notifier
from service.recovery.retry import RetryConfig
from service.scheduling.admission import Quotas
from service.scheduling.outside import ClusterJob, unmanaged
from service.store.db import Database
from service.store.models import Run, RunAttempt, RunLog, WebhookDelivery, utcnow
from service.store.status import RunStatus
from tests.factories import add_run, add_webhook, read_run
from tests.fake_ray import FakeRay

DIED = (
    "step:1 - critic/score/mean:0.1 - fully_async/count/current_param_version:1\n"
    "step:2 - critic/score/mean:0.2 - fully_async/count/current_param_version:2\n"
    "step:3 - critic/score/mean:0.3 - fully_async/count/current_param_version:3\n"
    "ray.exceptions.ActorDiedError: The actor died unexpectedly before finishing this task.\n"
)
DEATH = DIED.splitlines(keepends=True)[-1]
POLICY = {"max_attempts": 3, "on": ["actor_died"], "backoff_s": 0}


class Loops:
    """The three loops a retry goes through, on one database and one Ray in memory."""

    def __init__(self, db: Database, config: RetryConfig | None = None) -> None:
        self.db, self.ray = db, FakeRay()
        self.submitter = Submitter(
            db, self.ray, InventoryCache(self.ray, 0.0), Quotas(), "me", 30.0, 10
        )
        self.reconciler = Reconciler(db, self.ray, retry_config=config or RetryConfig())
        self.follower = Follower(
            db,
            self.ray,
            "me",
            30.0,
            100_000,
            HealthRules(),
            reader=WholeLogReader(self.ray),
            retry=config or RetryConfig(),
        )

    def end(self, job: str, status: str, log: str) -> None:
        """The job ends on Ray with this log; the loops see it, the final read included."""
        self.ray.log[job] = log
        self.ray.set_status(job, status)
        self.reconciler.tick()
        self.follower.tick()
        with self.db.transaction() as s:  # seen ended long enough ago for the final read
            run = s.scalars(select(Run)).one()
            if run.ended_at is not None:
                run.ended_at = utcnow() - timedelta(minutes=1)
            if run.ray_ended_at is not None:  # a success Ray reported waits for that read
                run.ray_ended_at = utcnow() - timedelta(minutes=1)
        self.follower.tick()

    def second_attempt_logs(self, log: str) -> None:
        """Run r1's attempt 2, submitted, is seen RUNNING and logs ``log``, which the follower
        reads."""
        self.ray.set_status("r1-a2", "RUNNING")
        self.reconciler.tick()
        self.ray.log["r1-a2"] = log
        self.follower.tick()

    def resumed(self, first: str, second: str) -> None:
        """Run r1's attempt 1 logs ``first`` and dies; the policy's attempt 2 logs ``second``."""
        self.end("r1", "FAILED", first + DEATH)
        self.submitter.tick()
        self.second_attempt_logs(second)


# The subscriptions these tests make: an admin's, with a 32-character secret.
_ADMIN_HOOK = {"created_by": "admin", "secret": "whsec_" + "A" * 32}


def _queued(db: Database, spec: dict[str, Any] | None = None) -> str:
    return add_run(db, "r1", RunStatus.QUEUED, spec={"retry": POLICY} if spec is None else spec)


def _submitted(
    db_url: str, spec: dict[str, Any] | None = None, config: RetryConfig | None = None
) -> tuple[Database, Loops]:
    """Run r1 (with ``spec``, by default one that retries) queued and submitted as attempt 1."""
    db = Database(db_url)
    loops = Loops(db, config)
    _queued(db, spec)
    loops.submitter.tick()
    return db, loops


def test_a_failure_the_policy_names_starts_the_next_attempt_as_its_own_job(
    api: TestClient, db_url: str
) -> None:
    db, loops = _submitted(db_url)
    assert [j["submission_id"] for j in loops.ray.submitted] == ["r1"]
    loops.end("r1", "FAILED", DIED)
    run, reasons = read_run(db)
    assert (run.status, run.attempt, run.resume) == (RunStatus.QUEUED, 2, "checkpoint")
    assert "retrying: attempt 2 of 3 after actor_died" in reasons
    loops.submitter.tick()
    second = loops.ray.submitted[-1]
    assert second["submission_id"] == "r1-a2"
    assert second["runtime_env"]["env_vars"]["RLRUN_RESUME"] == "checkpoint"
    assert second["runtime_env"]["env_vars"]["RLRUN_ATTEMPT"] == "2"
    # The follower reads the second job's log after the first's, one kept copy.
    loops.second_attempt_logs('rlrun resume: {"step": 2, "path": "/c/r1/global_step_2"}\n')
    doc = api.get("/runs/r1").json()
    assert doc["status"] == "RUNNING"
    assert doc["ray"]["submission_id"] == "r1-a2"
    assert [(a["n"], a["ray_job_id"], a["status"]) for a in doc["attempts"]] == [
        (1, "r1", "FAILED"),
        (2, "r1-a2", "RUNNING"),
    ]
    assert doc["attempts"][0]["failure"]["class"] == "actor_died"
    assert doc["attempts"][1]["resumed_from_step"] == 2
    assert doc["events"][-1]["attempt"] == 2 and doc["events"][0]["attempt"] == 1
    log = api.get("/runs/r1/logs").text
    assert log.startswith(DIED) and log.endswith('global_step_2"}\n')
    # A later attempt's Ray job is the run's, not a job outside the service.
    with db.read() as s:
        jobs = [ClusterJob(i, "SUBMISSION", "RUNNING", "", None) for i in ("r1-a2", "r9-a2")]
        assert [j.id for j in unmanaged(s, jobs)] == ["r9-a2"]


@pytest.mark.parametrize(
    ("spec", "log", "status"),
    [
        ({"retry": {**POLICY, "on": ["npu_oom"]}}, DIED, "FAILED"),  # a class it does not name
        ({}, DIED, "FAILED"),  # no policy, none by default
        ({"retry": POLICY}, "step:1 - a:1\n", "SUCCEEDED"),
    ],
)
def test_no_next_attempt_unless_the_policy_names_the_class(
    api: TestClient, db_url: str, spec: dict[str, Any], log: str, status: str
) -> None:
    db, loops = _submitted(db_url, spec)
    loops.end("r1", status, log)
    run, _ = read_run(db)
    assert (run.status, run.attempt) == (status, 1)


def test_attempts_stop_at_the_policy_s_and_the_team_s_limit(api: TestClient, db_url: str) -> None:
    db, loops = _submitted(
        db_url, config=RetryConfig(per_team={"t": 2}, max_attempts=5)
    )  # the policy asks for 3; team t may make 2
    loops.end("r1", "FAILED", DIED)
    loops.submitter.tick()
    loops.end("r1-a2", "FAILED", DIED)
    run, _ = read_run(db)
    assert (run.status, run.attempt) == (RunStatus.FAILED, 2)
    assert run.failure is not None and run.failure["class"] == "actor_died"
    with db.read() as s:
        assert [(a.n, a.status) for a in s.scalars(select(RunAttempt))] == [(1, "FAILED")]


def test_a_next_attempt_is_told_to_run_retrying_subscribers(api: TestClient, db_url: str) -> None:
    db = Database(db_url)
    loops = Loops(db)
    _queued(db)
    add_webhook(
        db, ["run.retrying"], hook_id="wh1", url="https://hooks.example.com/x", **_ADMIN_HOOK
    )
    loops.submitter.tick()
    loops.end("r1", "FAILED", DIED)
    with db.read() as s:
        sent = [(d.event_type, d.payload) for d in s.scalars(select(WebhookDelivery))]
    assert [(kind, body["attempt"]) for kind, body in sent] == [("run.retrying", 2)]
    assert headline("run.retrying", sent[0][1]).startswith("attempt 2: retrying")


def test_a_later_attempt_is_judged_by_its_own_log(api: TestClient, db_url: str) -> None:
    db, loops = _submitted(db_url)
    loops.end("r1", "FAILED", DIED)
    loops.submitter.tick()
    loops.end("r1-a2", "FAILED", "ModuleNotFoundError: No module named 'flash_attn'\n")
    run, _ = read_run(db)
    assert (run.status, run.attempt) == (RunStatus.FAILED, 2)  # import_error: not retried
    assert run.failure is not None and run.failure["class"] == "import_error", run.failure


def test_the_operator_s_default_policy_applies_to_a_spec_without_one(
    api: TestClient, db_url: str
) -> None:
    db = Database(db_url)
    from service.retry_policy import RetryPolicy

    loops = Loops(db, RetryConfig(default=RetryPolicy(max_attempts=2, backoff_s=0)))
    _queued(db, {})
    loops.submitter.tick()
    loops.end("r1", "FAILED", DIED)
    assert read_run(db)[0].attempt == 2


def test_a_cancel_during_the_backoff_stops_every_later_attempt(
    api: TestClient, db_url: str
) -> None:
    db, loops = _submitted(db_url, {"retry": {**POLICY, "backoff_s": 600}})
    loops.end("r1", "FAILED", DIED)
    run, reasons = read_run(db)
    assert run.status == RunStatus.QUEUED and run.retry_at is not None
    assert reasons[-1] == "retrying: attempt 2 of 3 after actor_died, in 600s"
    loops.submitter.tick()  # still backing off: not submitted
    assert len(loops.ray.submitted) == 1
    assert api.post("/runs/r1/cancel").json()["status"] == "CANCELLED"
    loops.submitter.tick()
    loops.follower.tick()
    run, _ = read_run(db)
    assert (run.status, run.attempt, len(loops.ray.submitted)) == ("CANCELLED", 2, 1)


def test_a_cancel_of_a_running_attempt_is_not_retried(api: TestClient, db_url: str) -> None:
    db, loops = _submitted(db_url)
    loops.ray.set_status("r1", "RUNNING")
    loops.reconciler.tick()
    api.post("/runs/r1/cancel")
    # The stop reaches Ray; the job happens to die of the same cause meanwhile.
    loops.end("r1", "FAILED", DIED)
    run, _ = read_run(db)
    assert (run.status, run.attempt) == (RunStatus.FAILED, 1)


def test_a_retry_by_hand_from_checkpoint_or_scratch(api: TestClient, db_url: str) -> None:
    db, loops = _submitted(db_url, {})
    loops.ray.set_status("r1", "RUNNING")
    loops.reconciler.tick()
    refused = api.post("/runs/r1/retry", json={"from": "checkpoint"})
    assert refused.status_code == 409, refused.text
    loops.end("r1", "SUCCEEDED", "step:1 - a:1\n")
    doc = api.post("/runs/r1/retry", json={"from": "scratch"}).json()
    assert (doc["status"], doc["attempt"]) == ("QUEUED", 2)
    assert doc["events"][-1]["reason"] == "retrying: attempt 2 from scratch, asked by anonymous"
    loops.submitter.tick()
    assert loops.ray.submitted[-1]["runtime_env"]["env_vars"]["RLRUN_RESUME"] == "scratch"
    loops.end("r1-a2", "FAILED", DIED)
    assert api.post("/runs/r1/retry").json()["attempt"] == 3  # from checkpoint by default
    assert api.post("/runs/r1/retry", json={"from": "disk"}).status_code == 422
    with db.read() as s:
        from service.store.models import AuditEntry

        assert s.scalars(select(AuditEntry.action).where(AuditEntry.run_id == "r1")).all() == [
            "run.retry",
            "run.retry",
        ]


def test_a_later_attempt_s_points_replace_the_earlier_ones_from_its_first_step(
    api: TestClient, db_url: str
) -> None:
    _, loops = _submitted(db_url)
    first = "".join(f"step:{s} - critic/score/mean:{s / 10} - x/y:1\n" for s in range(1, 41))
    # Resumed from step 30: steps 31.. again, with other values, then on to 50.
    again = "".join(f"step:{s} - critic/score/mean:{s / 100}\n" for s in range(31, 51))
    loops.resumed(first, again)
    series = api.get("/runs/r1/metrics", params={"max_points": 1000}).json()["series"]
    score = series["critic/score/mean"]
    assert [p["step"] for p in score] == list(range(1, 51))  # every step once
    assert [p["value"] for p in score[29:31]] == [3.0, 0.31]
    # Only the first attempt logged x/y: its points past the resumed step are gone with it.
    assert [p["step"] for p in series["x/y"]] == list(range(1, 31))
    # The tiers agree with the points: a downsampled read sees the new values only.
    coarse = api.get("/runs/r1/metrics", params={"max_points": 4}).json()["series"]
    assert max(p["max"] for p in coarse["critic/score/mean"]) == 3.0
    assert coarse["critic/score/mean"][-1]["value"] == 0.5
    latest = api.get("/runs/r1").json()["metrics"]["latest"]
    assert latest["critic/score/mean"] == 0.5


def test_a_resumed_attempt_keeps_the_earlier_record_up_to_its_checkpoint_s_step(
    api: TestClient, db_url: str
) -> None:
    _, loops = _submitted(db_url)
    # verl's way: a step's training figures come one sync late, so attempt 1's line at step 3
    # holds those of the step its checkpoint 3 saved; it died after logging step 4.
    first = "".join(f"step:{s} - critic/score/mean:{s / 10} - r/idle:1\n" for s in range(1, 5))
    # Resumed from checkpoint 3: verl says step 3 again at start (its sync, the rollouter's
    # figures), then trains on; its first training figures come at step 5.
    loops.resumed(
        first,
        'rlrun resume: {"step": 3, "path": "/c/r1/global_step_3"}\n'
        "step:3 - r/idle:0.5\n"
        "step:4 - r/idle:0.4\n"
        + "".join(f"step:{s} - critic/score/mean:{s / 100} - r/idle:0.3\n" for s in (5, 6)),
    )
    series = api.get("/runs/r1/metrics", params={"max_points": 1000}).json()["series"]
    score = [(p["step"], p["value"]) for p in series["critic/score/mean"]]
    # Attempt 1's up to its checkpoint's step, attempt 2's after: one history, no step twice.
    assert score == [(1, 0.1), (2, 0.2), (3, 0.3), (5, 0.05), (6, 0.06)]
    idle = [(p["step"], p["value"]) for p in series["r/idle"]]
    assert idle == [(1, 1.0), (2, 1.0), (3, 1.0), (4, 0.4), (5, 0.3), (6, 0.3)]


def test_a_policy_names_known_classes_and_attempts_within_bounds(api: TestClient) -> None:
    base = {"recipe": "tiny-grpo"}
    cases = [
        ({"on": ["bogus"]}, "retry.on[0]"),
        ({"on": ["cancelled"]}, "retry.on[0]"),
        ({"max_attempts": 0}, "retry.max_attempts"),
        ({"max_attempts": 21}, "retry.max_attempts"),
        ({"backoff_s": -1}, "retry.backoff_s"),
        ({"tries": 2}, "retry.tries"),
    ]
    for policy, field in cases:
        resp = api.post("/runs", json=base | {"retry": policy})
        assert resp.status_code == 422, (policy, resp.text)
        assert field in [e["field"] for e in resp.json()["errors"]], resp.json()
    # Over the operator's limit for the team (3 by default).
    resp = api.post("/runs", json=base | {"retry": {"max_attempts": 4}})
    assert resp.status_code == 422
    assert resp.json()["errors"][0]["field"] == "retry.max_attempts"
    ok = api.post("/runs", json=base | {"retry": {"max_attempts": 3, "on": ["node_lost"]}})
    assert ok.status_code == 201, ok.text
    assert ok.json()["spec"]["retry"] == {"max_attempts": 3, "on": ["node_lost"], "backoff_s": 30.0}


class _SlowToTakeFailures:
    """A receiver that records each message's type as it has taken it, a run.failed only after
    a pause: a sender that sent a subscription's messages side by side would be heard out of
    order."""

    def __init__(self) -> None:
        self.types: list[str] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                kind = json.loads(self.rfile.read(int(self.headers["content-length"])))["type"]
                if kind == "run.attempt_ended":
                    time.sleep(0.5)
                receiver.types.append(kind)
                self.send_response(200)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/in"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()


def test_a_subscriber_hears_an_attempt_ended_before_the_retry_and_no_run_failed(
    api: TestClient, db_url: str
) -> None:
    db = Database(db_url)
    loops = Loops(db)
    _queued(db)
    receiver = _SlowToTakeFailures()
    add_webhook(
        db,
        ["run.failed", "run.attempt_ended", "run.retrying"],
        hook_id="wh1",
        url=receiver.url,
        **_ADMIN_HOOK,
    )
    loops.submitter.tick()
    loops.end("r1", "FAILED", DIED)
    notifier = Notifier(db, "me", AllowList.parse(["127.0.0.1/32"]), "http://rlrun.example")
    try:
        notifier.tick()
    finally:
        receiver.httpd.shutdown()
        receiver.httpd.server_close()
    # The run did not fail: its attempt did, and the next one follows.
    assert receiver.types == ["run.attempt_ended", "run.retrying"]
    with db.read() as s:
        sent = {d.event_type: d.payload for d in s.scalars(select(WebhookDelivery))}
    ended = sent["run.attempt_ended"]
    assert (ended["attempt"]["n"], ended["attempt"]["status"]) == (1, "FAILED")
    assert ended["attempt"]["failure"]["class"] == "actor_died"
    assert (ended["next_attempt"], ended["event"]["to"]) == (2, "RETRYING")
    assert sent["run.retrying"]["attempt"] == 2


def _ended_while_ray_is_away(db_url: str, spec: dict[str, Any] | None = None) -> Loops:
    """Attempt 1 of r1 logged DIED (kept by the follower), then failed; Ray is gone since."""
    _, loops = _submitted(db_url, spec)
    loops.ray.log["r1"] = DIED
    loops.ray.set_status("r1", "RUNNING")
    loops.reconciler.tick()
    loops.follower.tick()  # the lines are kept while the job runs
    loops.ray.set_status("r1", "FAILED")
    loops.reconciler.tick()
    loops.ray.fail("logs", RayUnavailable("connection refused"), times=1000)
    loops.ray.fail("get", RayUnavailable("connection refused"), times=1000)
    return loops


def _ended_ago(db: Database, ago: timedelta) -> None:
    with db.transaction() as s:
        s.scalars(select(Run)).one().ended_at = utcnow() - ago


@pytest.mark.parametrize("away", ["unreachable", "cluster down"])
def test_an_attempt_that_ended_while_ray_is_away_is_decided_on_the_kept_log_in_time(
    api: TestClient, db_url: str, away: str
) -> None:
    loops = _ended_while_ray_is_away(db_url)
    if away == "cluster down":
        loops.follower.clusters.primary.health.up = False
    db = loops.db

    def tick() -> None:
        if away == "unreachable":  # every read fails: the round fails, as the loop backs off
            with pytest.raises(RayUnavailable):
                loops.follower.tick()
        else:
            loops.follower.tick()

    tick()
    _ended_ago(db, DECIDE_WITHIN - timedelta(seconds=5))
    tick()
    run, _ = read_run(db)
    assert (run.status, run.attempt_status, run.failure) == (
        RunStatus.RETRYING,
        RunStatus.FAILED,
        None,
    )
    _ended_ago(db, DECIDE_WITHIN + timedelta(seconds=1))
    tick()
    run, reasons = read_run(db)
    # Decided on what is known: the kept lines name the class, the policy retries it.
    assert (run.status, run.attempt) == (RunStatus.QUEUED, 2)
    why = "Ray fails to give its log" if away == "unreachable" else "its cluster default is down"
    decided = [r for r in reasons if r.startswith("decided on the log kept so far: ")]
    assert len(decided) == 1 and why in decided[0] and "120 s after the attempt ended" in decided[0]
    assert reasons[-1] == "retrying: attempt 2 of 3 after actor_died"
    doc = api.get("/runs/r1").json()
    first = doc["attempts"][0]
    assert first["status"] == "FAILED" and first["failure"]["class"] == "actor_died"
    assert decided[0] in first["failure"]["summary"]
    assert first["failure"]["evidence"][0]["line"].startswith("ray.exceptions.ActorDiedError")


def test_a_run_decided_on_the_kept_log_ends_as_its_attempt_did_when_not_retried(
    db_url: str,
) -> None:
    loops = _ended_while_ray_is_away(db_url, {"retry": {**POLICY, "on": ["npu_oom"]}})
    _ended_ago(loops.db, DECIDE_WITHIN + timedelta(seconds=1))
    with pytest.raises(RayUnavailable):
        loops.follower.tick()
    run, reasons = read_run(loops.db)
    assert run.status == RunStatus.FAILED and run.failure is not None
    assert run.failure["class"] == "actor_died"
    assert "decided on the log kept so far" in run.failure["summary"]
    assert reasons[-1] == "not retried: its policy does not retry actor_died"
    # The API reference states the bound the follower keeps.
    assert f"at most {DECIDE_WITHIN.total_seconds():g} s after the" in " ".join(
        (RunStatus.__doc__ or "").split()
    )
    # Decided once: the run's log is no longer followed.
    with loops.db.transaction() as s:
        runlog = s.get(RunLog, "r1")
        assert runlog is not None and runlog.finished_at is not None


HOST_OOM = (
    "ray.exceptions.OutOfMemoryError: Task was killed due to the node running low on memory.\n"
)


def test_a_host_oom_is_retried_once_whatever_the_policy_s_attempts(
    api: TestClient, db_url: str
) -> None:
    db, loops = _submitted(db_url, {"retry": {**POLICY, "max_attempts": 5, "on": ["host_oom"]}})
    loops.end("r1", "FAILED", HOST_OOM)
    run, reasons = read_run(db)
    assert (run.status, run.attempt) == (RunStatus.QUEUED, 2), reasons
    loops.submitter.tick()
    loops.end("r1-a2", "FAILED", HOST_OOM)
    run, reasons = read_run(db)
    assert (run.status, run.attempt) == (RunStatus.FAILED, 2)
    assert "not retried: host_oom is retried once, and an earlier attempt ended with it too" in (
        reasons
    )
