"""SIGKILL the service at random moments while 16 runs are accepted and submitted.

After restarts, every accepted run must have reached Ray exactly once, and nothing else must
have: the run id is Ray's submission id, claims lapse, and retries find "already exists".
"""

from __future__ import annotations

import random
import threading
import time
import uuid
from pathlib import Path

import httpx
import pytest

from service.cluster.local_ray import LocalRayCluster
from service.cluster.ray_jobs import RayJobs
from tests.conftest import _truncate, transitions, wait_for
from tests.service_process import ServiceProcess

pytestmark = [pytest.mark.ray, pytest.mark.slow]

N_RUNS = 16
PACE_S = 0.1  # 1.6 s of accepting while the service is up; a kill comes every 0.2-1.2 s of it
# The test thread's own client (the accepting thread has its own): a new client per call loads
# the CA bundle, about 60 ms of CPU, taken from the service being restarted.
HTTP = httpx.Client(timeout=10)


def _accept_all(service: ServiceProcess, token: str, accepted: dict[str, str]) -> None:
    """A client that retries each POST with its Idempotency-Key until it gets an answer, one
    run every ``PACE_S`` at most: the accepts span several kills however fast each one is."""
    with httpx.Client(timeout=5) as http:
        for i in range(N_RUNS):
            _accept(http, service, f"{token}-{i}", accepted)
            time.sleep(PACE_S)


def _accept(
    http: httpx.Client, service: ServiceProcess, key: str, accepted: dict[str, str]
) -> None:
    body = {"recipe": "test-script", "name": key}
    while True:
        try:
            resp = http.post(f"{service.url}/runs", json=body, headers={"Idempotency-Key": key})
        except httpx.HTTPError:
            time.sleep(0.05)
            continue
        if resp.status_code == 201:
            accepted[key] = resp.json()["id"]
            return
        assert resp.status_code >= 500, resp.text
        time.sleep(0.05)


def test_sigkill_at_random_moments_loses_and_duplicates_nothing(
    db_url: str, ray_cluster: LocalRayCluster, ray: RayJobs, tmp_path: Path
) -> None:
    rng = random.Random(7)
    token = f"crash-{uuid.uuid4().hex[:8]}"
    service = ServiceProcess(db_url, ray_cluster.address, tmp_path / "service.log")
    accepted: dict[str, str] = {}
    client = threading.Thread(target=_accept_all, args=(service, token, accepted), daemon=True)
    service.start()
    client.start()
    try:
        # Kill while runs are being accepted, then while the last ones are being submitted.
        extra_kills, kills_accepting = 3, 0
        while client.is_alive() or extra_kills:
            time.sleep(rng.uniform(0.2, 1.2))
            accepting = client.is_alive()
            service.kill()
            service.start()
            kills_accepting += accepting
            if not client.is_alive():
                extra_kills -= 1
        client.join()
        assert len(accepted) == N_RUNS

        def runs() -> list[dict[str, object]]:
            items: list[dict[str, object]] = HTTP.get(
                f"{service.url}/runs", params={"limit": 200}
            ).json()["items"]
            return items

        stored = wait_for(runs, lambda rs: all(r["status"] != "QUEUED" for r in rs), timeout=180)
    finally:
        service.stop()

    assert kills_accepting >= 2 and service.kills >= 5
    assert {r["name"]: r["id"] for r in stored} == accepted
    on_ray = [j.submission_id for j in ray.list_jobs() if j.submission_id in accepted.values()]
    assert sorted(on_ray) == sorted(accepted.values())
    # Each run was recorded as submitted exactly once, whatever the number of attempts.
    service.start()
    try:
        for run_id in accepted.values():
            run = HTTP.get(f"{service.url}/runs/{run_id}").json()
            # Transitions only: a note (Ray's word on a job not yet read to the end) keeps the
            # status it was written in.
            assert transitions(run).count("SUBMITTED") == 1, run
    finally:
        service.stop()


N_REPLICATED = 10


@pytest.mark.postgres
def test_two_replicas_on_one_postgres_never_both_submit_a_run(
    pg_database: str, ray_cluster: LocalRayCluster, ray: RayJobs, tmp_path: Path
) -> None:
    _truncate(pg_database)
    replicas = [
        ServiceProcess(pg_database, ray_cluster.address, tmp_path / f"s{i}.log") for i in range(2)
    ]
    for replica in replicas:
        replica.env["RLRUN_CLAIM_TTL_S"] = "60"
        replica.start()
    try:
        ids = [
            HTTP.post(f"{replicas[i % 2].url}/runs", json={"recipe": "test-script"}).json()["id"]
            for i in range(N_REPLICATED)
        ]
        done = wait_for(
            lambda: [HTTP.get(f"{replicas[0].url}/runs/{i}").json() for i in ids],
            lambda rs: all(r["status"] not in {"QUEUED", "SUBMITTED", "RUNNING"} for r in rs),
            timeout=180,
        )
    finally:
        for replica in replicas:
            replica.stop()
    reasons = [e["reason"] for run in done for e in run["events"]]
    # A second attempt would have met Ray's "already exists" and said so in the event.
    assert reasons.count("submitted to Ray") == N_REPLICATED
    assert not any("already on Ray" in r for r in reasons)
    assert all(run["status"] == "SUCCEEDED" for run in done)


N_RETRIED = 3
DIES = "ray.exceptions.ActorDiedError: The actor died unexpectedly before finishing this task."


def test_sigkill_while_runs_are_retried_starts_each_attempt_once(
    db_url: str, ray_cluster: LocalRayCluster, ray: RayJobs, tmp_path: Path
) -> None:
    rng = random.Random(11)
    service = ServiceProcess(db_url, ray_cluster.address, tmp_path / "service.log")
    service.start()
    body = {
        "recipe": "test-script",
        "seconds": 0.5,
        "exit_code": 1,
        "message": DIES,
        "retry": {"max_attempts": 2, "on": ["actor_died"], "backoff_s": 0},
    }
    ids = [HTTP.post(f"{service.url}/runs", json=body).json()["id"] for _ in range(N_RETRIED)]

    def runs() -> list[dict[str, object]]:
        out = []
        for run_id in ids:
            try:
                out.append(HTTP.get(f"{service.url}/runs/{run_id}", timeout=5).json())
            except httpx.HTTPError:
                return []
        return out

    def over(rs: list[dict[str, object]]) -> bool:
        return bool(rs) and all(r["attempt"] == 2 and r["status"] == "FAILED" for r in rs)

    try:
        # Kill while first attempts fail, are settled and requeued, and second ones submitted.
        for _ in range(6):
            time.sleep(rng.uniform(0.3, 1.5))
            service.kill()
            service.start()
        done = wait_for(runs, over, timeout=240, every=1.0)
    finally:
        service.stop()
    assert service.kills >= 6
    expected = sorted([*ids, *(f"{i}-a2" for i in ids)])
    on_ray = sorted(j.submission_id for j in ray.list_jobs() if j.submission_id in expected)
    assert on_ray == expected  # both attempts of each run on Ray, and nothing more
    for run in done:
        moves = [
            (e["attempt"], e["to_status"])
            for e in run["events"]  # type: ignore[attr-defined]
            if e["from_status"] != e["to_status"]
        ]
        assert moves.count((1, "SUBMITTED")) == 1 and moves.count((2, "SUBMITTED")) == 1, run
        attempts = run["attempts"]
        assert [(a["n"], a["status"]) for a in attempts] == [(1, "FAILED"), (2, "FAILED")]  # type: ignore[attr-defined]
