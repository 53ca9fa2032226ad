"""The status contract: a terminal status is final. Random attempt outcomes (a failure of some
class, a success, a success short of a fatal error, a job Ray forgets), cancels at random
moments and random retry policies go through the real loops (Ray in memory), and no observer
ever sees a terminal status followed by another:

- a poller of ``GET /runs/{id}`` and one of ``GET /runs`` (its status filter too), after every
  tick of a loop;
- a subscriber of the event stream (the stream's own read, ``broker.read_after``, from its
  cursor after every tick; then the whole ``GET /runs/{id}/events`` replayed): its status
  events, and ``end`` only after a terminal one;
- a webhook subscriber of ``run.status``, ``run.failed`` and ``run.attempt_ended``: a status
  told after a terminal one, a ``run.failed`` for a run that did not end FAILED, or an attempt
  told final while another followed.

(A retry asked for by hand is the contract's one exception, and is tested in test_retry.py.)
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import select

from service.app import create_app
from service.cluster.inventory_cache import InventoryCache
from service.loops.follower import Follower
from service.loops.reconciler import Reconciler
from service.loops.submitter import Submitter
from service.metrics.broker import Cursor, read_after
from service.metrics.health import HealthRules
from service.metrics.log_readers import WholeLogReader
from service.recovery.retry import RetryConfig
from service.scheduling.admission import Quotas
from service.store.db import Database, upgrade
from service.store.models import Run, WebhookDelivery, utcnow
from service.store.status import TERMINAL, RunStatus
from tests.conftest import make_settings
from tests.factories import add_run, add_webhook
from tests.fake_ray import FakeRay
from tests.test_metrics_api import sse

STEPS = "".join(
    f"step:{i} - critic/score/mean:0.{i} - fully_async/count/current_param_version:{i}\n"
    for i in (1, 2, 3)
)
LOGS = {
    "actor_died": STEPS + "ray.exceptions.ActorDiedError: The actor died unexpectedly.\n",
    "npu_oom": STEPS + "torch.OutOfMemoryError: NPU out of memory. Tried to allocate 2.00 GiB\n",
    "unknown": STEPS + "something went wrong\n",
}
# How an attempt's job ends on Ray: (Ray's status, its log); "forgotten": Ray no longer knows it.
OUTCOMES = {
    "died": ("FAILED", LOGS["actor_died"]),
    "oom": ("FAILED", LOGS["npu_oom"]),
    "unknown": ("FAILED", LOGS["unknown"]),
    "succeeded": ("SUCCEEDED", STEPS),
    "exited_0_after_an_error": ("SUCCEEDED", LOGS["actor_died"]),  # verl issue 6387
    "forgotten": (None, STEPS),
}
# When a cancel comes, in an attempt's life.
MOMENTS = ("queued", "running", "ended", "read")
CLASSES = ["actor_died", "npu_oom", "node_lost", "unknown"]


@dataclass
class Observers:
    """What each observer has seen of one run, in order."""

    run_id: str
    polled: list[str] = field(default_factory=list)
    listed: list[str] = field(default_factory=list)
    streamed: list[str] = field(default_factory=list)
    stream_ended_after: str | None = None
    cursor: Cursor = field(default_factory=Cursor)

    def look(self, api: TestClient, db: Database) -> None:
        doc = api.get(f"/runs/{self.run_id}").json()
        self.polled.append(doc["status"])
        page = api.get("/runs", params={"status": doc["status"], "limit": 200}).json()
        self.listed += [r["status"] for r in page["items"] if r["id"] == self.run_id]
        with db.read_rows() as conn:
            read = read_after(conn, self.run_id, self.cursor)
        for item in read.items:
            if item.kind == "status":
                self.cursor = Cursor(item.position, self.cursor.offset)
                if item.data["from_status"] != item.data["to_status"]:
                    self.streamed.append(item.data["to_status"])
            elif item.kind == "metrics":
                self.cursor = Cursor(self.cursor.event_id, item.position)
        if read.complete and self.stream_ended_after is None:
            self.stream_ended_after = self.streamed[-1] if self.streamed else None


def final_once(seen: list[str], who: str) -> None:
    """Nothing after a terminal status but that status again."""
    for i, status in enumerate(seen):
        if status in TERMINAL:
            assert set(seen[i:]) == {status}, f"{who} saw {seen}"
            return


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Database, TestClient]]:
    url = f"sqlite:///{tmp_path_factory.mktemp('contract')}/contract.db"
    upgrade(url)
    db = Database(url)
    add_webhook(
        db,
        ["run.status", "run.failed", "run.attempt_ended"],
        hook_id="wh1",
        url="https://hooks.example/in",
        created_by="admin",
        secret="whsec_" + "A" * 32,
    )
    app = create_app(make_settings(url, "http://127.0.0.1:9", run_loops=False, read_cache_s=0))
    with TestClient(app) as api:
        yield db, api
    db.dispose()


_ids = itertools.count()

policies = st.one_of(
    st.none(),
    st.fixed_dictionaries(
        {
            "max_attempts": st.integers(1, 4),
            "on": st.lists(st.sampled_from(CLASSES), unique=True),
            "backoff_s": st.sampled_from([0, 0, 3600]),
        }
    ),
)


# The same cases on every run (a red run is reproduced by running it again).
@settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=list(HealthCheck),
)
@given(
    policy=policies,
    outcomes=st.lists(st.sampled_from(sorted(OUTCOMES)), min_size=1, max_size=5),
    cancel=st.one_of(st.none(), st.tuples(st.integers(1, 4), st.sampled_from(MOMENTS))),
    reconciler_first=st.lists(st.booleans(), min_size=5, max_size=5),
)
def test_no_observer_sees_a_terminal_status_followed_by_another(
    world: tuple[Database, TestClient],
    policy: dict[str, Any] | None,
    outcomes: list[str],
    cancel: tuple[int, str] | None,
    reconciler_first: list[bool],
) -> None:
    db, api = world
    run_id = f"c{next(_ids)}"
    ray = FakeRay()
    config = RetryConfig()
    submitter = Submitter(db, ray, InventoryCache(ray, 0.0), Quotas(), "me", 30.0, 10)
    reconciler = Reconciler(db, ray, retry_config=config)
    follower = Follower(
        db, ray, "me", 30.0, 100_000, HealthRules(), reader=WholeLogReader(ray), retry=config
    )
    add_run(db, run_id, RunStatus.QUEUED, spec={} if policy is None else {"retry": policy})
    seen = Observers(run_id)

    def status() -> str:
        with db.read() as s:
            return str(s.scalar(select(Run.status).where(Run.id == run_id)))

    def tick(*loops: Any) -> None:
        for loop in loops:
            loop.tick()
            seen.look(api, db)

    def maybe_cancel(n: int, moment: str) -> None:
        if cancel == (n, moment) and status() not in TERMINAL:
            assert api.post(f"/runs/{run_id}/cancel").status_code == 200
            seen.look(api, db)

    def backdate() -> None:
        """Seen ended long enough ago for the follower's final read (and Ray's success)."""
        with db.transaction() as s:
            run = s.get(Run, run_id)
            assert run is not None
            long_ago = utcnow() - timedelta(minutes=5)
            run.ended_at = run.ended_at and long_ago
            run.ray_ended_at = run.ray_ended_at and long_ago
            run.retry_at = run.retry_at and long_ago  # the backoff is over

    for n in range(1, 8):
        job = run_id if n == 1 else f"{run_id}-a{n}"
        maybe_cancel(n, "queued")
        tick(submitter)
        if status() in TERMINAL:
            break
        ray.set_status(job, "RUNNING")
        tick(reconciler)
        maybe_cancel(n, "running")
        tick(reconciler)  # a stop asked for is delivered (the job STOPPED)
        ray_status, log = OUTCOMES[outcomes[min(n, len(outcomes)) - 1]]
        ray.log[job] = log
        if ray_status is None:
            ray.jobs.pop(job, None)
        elif ray.jobs[job].status == "RUNNING":
            ray.set_status(job, ray_status)
        first = reconciler_first[min(n, len(reconciler_first)) - 1]
        tick(*((reconciler, follower) if first else (follower, reconciler)))
        maybe_cancel(n, "ended")
        backdate()
        tick(follower, reconciler)
        backdate()
        tick(follower)
        maybe_cancel(n, "read")
        if status() in TERMINAL:
            break
    assert status() in TERMINAL, seen.polled
    backdate()
    tick(follower)  # the final read of a run a cancel ended while it decided

    final_once(seen.polled, "a poller of GET /runs/{id}")
    final_once(seen.listed, "a poller of GET /runs")
    final_once(seen.streamed, "a subscriber of the event stream")
    assert seen.stream_ended_after is None or seen.stream_ended_after in TERMINAL, seen.streamed
    replayed = [
        e["data"]["to_status"]
        for e in sse(api.get(f"/runs/{run_id}/events").text)
        if e["event"] == "status" and e["data"]["from_status"] != e["data"]["to_status"]
    ]
    final_once(replayed, "the event stream replayed")
    end = status()
    with db.read() as s:
        told = sorted(
            (d.payload["event"]["id"], d.event_type, d.payload)
            for d in s.scalars(select(WebhookDelivery).where(WebhookDelivery.run_id == run_id))
        )
    final_once([p["event"]["to"] for _, kind, p in told if kind == "run.status"], "a webhook")
    failed = [p for _, kind, p in told if kind == "run.failed"]
    assert len(failed) == (1 if end == RunStatus.FAILED else 0), (end, told)
    ended = [p for _, kind, p in told if kind == "run.attempt_ended"]
    assert [p["attempt"]["n"] for p in ended] == sorted({p["attempt"]["n"] for p in ended})
    assert all(p["next_attempt"] is not None for p in ended[:-1]), ended
    if ended and ended[-1]["next_attempt"] is not None:
        # Told as followed by an attempt that never reached Ray: cancelled in its queue.
        with db.read() as s:
            last = s.scalar(select(Run.attempt).where(Run.id == run_id))
        assert (end, last) == (RunStatus.CANCELLED, ended[-1]["next_attempt"]), ended
