"""A lost node on the real local Ray head: tiny-grpo's actors sit on the second node, which is
stopped mid-run; the run fails ``node_lost`` on the word of Ray's state API, and its policy
starts attempt 2 once, as its own Ray job, on the head that remains, where it succeeds. The
session's cluster gets its second node back afterwards."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from service.cluster.local_ray import LocalRayCluster
from service.cluster.ray_jobs import RayJobs
from service.recovery.deaths import PREFIX
from tests.conftest import transitions, wait_for
from tests.recipes import retried_tiny_grpo
from tests.two_nodes import ACTORS, actor_nodes, hold_head

pytestmark = [pytest.mark.ray, pytest.mark.slow]

SPEC = retried_tiny_grpo("lost-node", 10, "node_lost")


def test_a_run_whose_node_is_lost_is_retried_once_on_the_nodes_that_remain(
    ray_cluster: LocalRayCluster,
    ray: RayJobs,
    sqlite_service: Callable[..., TestClient],
    tmp_path: Path,
) -> None:
    (head,) = [n["node_id"] for n in ray.state("nodes", "ALIVE") if n.get("is_head_node")]
    # A job outside the service holds the head's NPUs, so the run can only be placed on the
    # second node; it lets go before that node is lost, so the retry fits on the head.
    holder = hold_head(ray)
    stopped = False
    try:
        with sqlite_service(
            follow_interval_s=0.3, tiny_grpo_checkpoint_root=str(tmp_path / "checkpoints")
        ) as client:
            run_id = client.post("/runs", json=SPEC).json()["id"]
            first_nodes = wait_for(
                lambda: actor_nodes(ray, run_id, "ALIVE"),
                lambda nodes: set(nodes) == ACTORS,
                timeout=120,
                every=0.3,
            )
            assert head not in first_nodes.values(), first_nodes
            ray.stop(holder)  # its NPUs are free again by the time the retry is admitted
            wait_for(
                lambda: client.get(f"/runs/{run_id}").json()["progress"]["step"] or 0,
                lambda step: step >= 2,  # past the first checkpoint
                timeout=120,
                every=0.2,
            )

            ray_cluster.stop_node(1)
            stopped, lost = True, time.monotonic()
            wait_for(
                lambda: client.get(f"/runs/{run_id}").json(),
                lambda r: r["attempt"] == 2 and r["status"] != "QUEUED",
                timeout=120,
                every=0.2,
            )
            print(f"\nnode lost -> attempt 2 submitted: {time.monotonic() - lost:.1f}s")
            done: dict[str, Any] = wait_for(
                lambda: client.get(f"/runs/{run_id}").json(),
                lambda r: r["attempt"] == 2 and r["status"] in {"SUCCEEDED", "FAILED", "LOST"},
                timeout=120,
                every=0.3,
            )
            assert done["status"] == "SUCCEEDED", (done["events"], done["attempts"])
            first, second = done["attempts"]
            assert (first["ray_job_id"], first["status"]) == (run_id, "FAILED")
            assert first["failure"]["class"] == "node_lost", first["failure"]
            assert any(
                e["line"].startswith(f"{PREFIX}node ") for e in first["failure"]["evidence"]
            ), first["failure"]
            assert second["ray_job_id"] == f"{run_id}-a2"
            # Each attempt submitted once, and Ray holds exactly one job per attempt.
            assert transitions(done).count("SUBMITTED") == 2, transitions(done)
            ours = sorted(j.submission_id for j in ray.list_jobs() if run_id in j.submission_id)
            assert ours == [run_id, f"{run_id}-a2"], ours
            # Placed on what remains: the head.
            assert set(actor_nodes(ray, f"{run_id}-a2", "DEAD").values()) == {head}
    finally:
        if stopped:
            ray_cluster.start_node(1)
