"""Two real local Ray heads behind one service: cluster `a` (one node x 8 NPUs, every team) and
cluster `b` (two nodes x 8 NPUs, team vision only), declared in a clusters file with their
tokens by secret reference.

Runs land where they fit (8 + 4 only on `b`, 1 + 1 on the first with room), a team naming a
cluster it may not use is refused at `cluster`; then `b`'s head stops: it is marked down, its
running run without a policy ends LOST, the one whose policy names `cluster_down` is retried on
`a`, the queued run that fits only `b` waits with "cluster down"; `b`'s head starts again and
the cluster is up without a restart of the service, the waiting run runs there. Every run
ends, each job submitted once, on one head. The timeline is printed (``pytest -s``).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from service.app import create_app
from service.cluster.local_ray import LocalRayCluster
from service.cluster.ray_jobs import RayJobs
from tests import conftest
from tests.conftest import TERMINAL, make_settings, submit, transitions, wait_for, wait_status

pytestmark = [pytest.mark.ray, pytest.mark.slow]

# The second head's ports: apart from the session cluster's and the other tests' heads.
PORT = conftest.RAY_PORT + 1100
DOWN_AFTER_S = 3.0
PROBE_S = 0.5
LONG = 600.0  # runs that hold their cluster until stopped


def _groups(*sizes: int) -> list[dict[str, Any]]:
    return [{"accelerators": n, "cpus": 0, "role": f"g{i}"} for i, n in enumerate(sizes)]


@dataclass
class Heads:
    a: LocalRayCluster
    b: LocalRayCluster
    file: Path
    secrets: Path
    timeline: dict[str, float] = field(default_factory=dict)


@pytest.fixture(scope="module")
def heads(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Heads]:
    a = LocalRayCluster([8], cpus_per_node=4, port=PORT, dashboard_port=PORT + 100)
    b = LocalRayCluster([8, 8], cpus_per_node=4, port=PORT + 200, dashboard_port=PORT + 300)
    root = tmp_path_factory.mktemp("clusters")
    secrets = root / "secrets"
    (secrets / "service").mkdir(parents=True)
    try:
        a.start(timeout_s=240)
        b.start(timeout_s=240)
        (secrets / "service" / "ray-a").write_text(a.token)
        (secrets / "service" / "ray-b").write_text(b.token)
        path = root / "clusters.yaml"
        path.write_text(
            "clusters:\n"
            f"  - name: a\n    address: {a.address}\n    token: {{secret: ray-a}}\n"
            "    accelerator: NPU\n    labels: {size: small}\n"
            f"  - name: b\n    address: {b.address}\n    token: {{secret: ray-b}}\n"
            "    accelerator: NPU\n    labels: {size: big}\n    teams: [vision]\n"
        )
        yield Heads(a, b, path, secrets)
    finally:
        a.cleanup()
        b.cleanup()


def _restart(head: LocalRayCluster) -> None:
    """Start the stopped head again (the same handle: the same ports and token); what its
    nodes said if it cannot."""
    try:
        head.start(timeout_s=240)
    except BaseException:
        for log in sorted(head.base_dir.glob("node*.log")):
            print(f"--- {log}\n{log.read_text()[-3000:]}")
        raise


def _at(stamp: str) -> float:
    return datetime.fromisoformat(stamp).timestamp()


def _cluster(client: TestClient, name: str) -> dict[str, Any]:
    found: dict[str, Any] = next(
        c for c in client.get("/clusters").json()["clusters"] if c["name"] == name
    )
    return found


def test_runs_go_where_they_fit_and_a_cluster_that_goes_away_and_back_is_handled(
    heads: Heads, tmp_path: Path
) -> None:
    settings = make_settings(
        f"sqlite:///{tmp_path}/db.sqlite",
        heads.a.address,
        clusters_file=str(heads.file),
        secrets_dir=str(heads.secrets),
        cluster_down_after_s=DOWN_AFTER_S,
        cluster_probe_interval_s=PROBE_S,
        inventory_ttl_s=0.5,
        follow_interval_s=0.3,
        stop_grace_s=1,
    )
    times = heads.timeline
    with TestClient(create_app(settings)) as client:
        # Refused at the door: a team naming a cluster it may not use.
        refused = client.post(
            "/runs", json={"recipe": "test-script", "team": "nlp", "cluster": "b"}
        )
        assert refused.status_code == 422
        assert refused.json()["errors"][0]["field"] == "cluster"

        big = submit(client, team="vision", seconds=LONG, groups=_groups(8, 4))
        small = submit(client, team="nlp", seconds=LONG, groups=_groups(1, 1))
        fill = submit(client, team="nlp", seconds=LONG, groups=_groups(6))
        for run_id in (big, small, fill):
            wait_status(client, run_id, {"RUNNING"}, timeout=120)
        # 8 + 4 fits only b's two nodes; 1 + 1 and 6 fill a.
        on = {r: client.get(f"/runs/{r}").json()["cluster"] for r in (big, small, fill)}
        assert on == {big: "b", small: "a", fill: "a"}
        # a is full: this one goes to b, and goes elsewhere should b go away.
        policy = {"max_attempts": 2, "on": ["cluster_down"], "backoff_s": 0}
        moving = submit(client, team="vision", seconds=LONG, groups=_groups(1, 1), retry=policy)
        assert wait_status(client, moving, {"RUNNING"}, timeout=120)["cluster"] == "b"
        # Fits only b, which is busy: it waits there.
        waiting = submit(client, team="vision", seconds=1, groups=_groups(8, 8))
        wait_for(
            lambda: client.get(f"/runs/{waiting}").json()["queue_reason"] or "",
            lambda reason: reason.startswith("waits for b: "),
        )
        client.post(f"/runs/{fill}/cancel")  # room on a for the run that moves
        wait_status(client, fill, TERMINAL, timeout=60)

        times["stopping head b"] = time.monotonic()
        heads.b.stop()  # its nodes' processes are waited for: on a loaded machine, a while
        times["head b stopped"] = time.monotonic()
        health = wait_for(
            lambda: _cluster(client, "b")["health"], lambda h: not h["up"], timeout=30
        )
        times["b marked down"] = time.monotonic()
        # From the first probe that failed to down: the window, and within the 10 s goal.
        detected = _at(health["since"]) - _at(health["failing_since"])
        assert DOWN_AFTER_S <= detected <= 10.0, health
        lost = wait_status(client, big, {"LOST"}, timeout=30)
        times["running run LOST"] = time.monotonic()
        assert transitions(lost)[-1] == "LOST" and lost["events"][-1]["reason"] == "cluster b down"
        requeued = wait_for(
            lambda: client.get(f"/runs/{moving}").json(),
            lambda r: r["attempt"] == 2,
            timeout=30,
        )
        times["retried run requeued"] = time.monotonic()
        assert any("after cluster_down" in e["reason"] for e in requeued["events"])
        wait_for(
            lambda: client.get(f"/runs/{moving}").json(),
            lambda r: r["status"] == "RUNNING" and r["cluster"] == "a",
            timeout=120,
        )
        times["retried run running on a"] = time.monotonic()
        reason = client.get(f"/runs/{waiting}").json()["queue_reason"]
        assert reason.startswith("waits for b: cluster down since "), reason

        times["head b started"] = time.monotonic()
        _restart(heads.b)
        times["head b answers"] = time.monotonic()
        wait_for(lambda: _cluster(client, "b")["health"]["up"], bool, timeout=30)
        times["b marked up"] = time.monotonic()
        done = wait_status(client, waiting, TERMINAL, timeout=180)
        assert (done["status"], done["cluster"]) == ("SUCCEEDED", "b")

        for run_id in (small, moving):
            client.post(f"/runs/{run_id}/cancel")
        runs = {
            r: wait_status(client, r, TERMINAL, timeout=60)
            for r in (big, small, fill, moving, waiting)
        }
        # Each attempt went to Ray once, on one head (b's job table is new since its restart).
        for run_id, run in runs.items():
            assert transitions(run).count("SUBMITTED") == run["attempt"], run_id
        jobs = {}
        for name, head in (("a", heads.a), ("b", heads.b)):
            ray = RayJobs(head.address, head.token)
            jobs[name] = sorted(j.submission_id for j in ray.list_jobs())
            ray.close()
        assert jobs == {"a": sorted([small, fill, f"{moving}-a2"]), "b": [waiting]}

    start = times["stopping head b"]
    print("\ndown-and-back timeline (s after head b began to stop):")
    for what, at in times.items():
        print(f"  {at - start:6.1f}  {what}")
    print(f"  first failed probe -> b marked down: {detected:.1f} s")
