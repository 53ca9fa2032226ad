"""A draining node on the real local Ray head: tiny-grpo's actors sit on the second node, which
Ray is told to drain (a preemption, 60 s deadline: the autoscaler's and ``ray drain-node``'s
own call); the run saves at its next checkpoint, stops, and comes back as attempt 2 on the
head, resuming from that save with no step lost. Ray ends the drained node once it is idle;
the session's cluster gets its second node back afterwards."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
from fastapi.testclient import TestClient
from ray.core.generated import autoscaler_pb2, autoscaler_pb2_grpc

from service.cluster.drains import DrainReader
from service.cluster.local_ray import LocalRayCluster
from service.cluster.ray_jobs import RayJobs
from tests.conftest import transitions, wait_for
from tests.two_nodes import ACTORS, actor_nodes, hold_head

pytestmark = [pytest.mark.ray, pytest.mark.slow]

SPEC = {
    "recipe": "tiny-grpo",
    "name": "drained",
    "total_rollout_steps": 16 * 8,
    "gen_seconds": 0.3,
    "save_every": 2,
}
DEADLINE_S = 60


def _drain(cluster: LocalRayCluster, node_id: str, deadline_s: int) -> None:
    """What the autoscaler and ``ray drain-node`` ask of the GCS."""
    any_pb: Any = autoscaler_pb2
    with grpc.insecure_channel(cluster.gcs_address) as channel:
        stub: Any = autoscaler_pb2_grpc.AutoscalerStateServiceStub(channel)  # type: ignore[no-untyped-call]
        reply = stub.DrainNode(
            any_pb.DrainNodeRequest(
                node_id=bytes.fromhex(node_id),
                reason=any_pb.DRAIN_NODE_REASON_PREEMPTION,
                reason_message="spot reclaim",
                deadline_timestamp_ms=int(time.time() * 1000) + deadline_s * 1000,
            ),
            metadata=[("authorization", f"Bearer {cluster.token}")],
            timeout=10,
        )
    assert reply.is_accepted, reply.rejection_reason_message


def test_a_run_on_a_draining_node_saves_stops_and_resumes_elsewhere_losing_nothing(
    ray_cluster: LocalRayCluster,
    ray: RayJobs,
    sqlite_service: Callable[..., TestClient],
    tmp_path: Path,
) -> None:
    (head,) = [n["node_id"] for n in ray.state("nodes", "ALIVE") if n.get("is_head_node")]
    reader = DrainReader(ray_cluster.gcs_address, ray_cluster.token)
    assert reader.draining() == []
    # A job outside the service holds the head's NPUs, so the run is placed on the second
    # node; it lets go before the drain, so attempt 2 fits on the head.
    holder = hold_head(ray)
    drained = False
    try:
        with sqlite_service(
            follow_interval_s=0.3,
            tiny_grpo_checkpoint_root=str(tmp_path / "checkpoints"),
            ray_gcs_address=ray_cluster.gcs_address,
        ) as client:
            run_id = client.post("/runs", json=SPEC).json()["id"]
            nodes = wait_for(
                lambda: actor_nodes(ray, run_id, "ALIVE"),
                lambda found: set(found) == ACTORS,
                timeout=120,
                every=0.3,
            )
            (worker,) = set(nodes.values())
            assert worker != head, nodes
            ray.stop(holder)
            wait_for(
                lambda: client.get(f"/runs/{run_id}").json()["checkpoint"],
                lambda saved: bool(saved),
                timeout=120,
                every=0.2,
            )

            _drain(ray_cluster, worker, DEADLINE_S)
            drained, at = True, time.monotonic()
            (seen,) = reader.draining()
            assert seen.node_id == worker and seen.deadline is not None
            wait_for(
                lambda: client.get(f"/runs/{run_id}").json(),
                lambda r: r["attempt"] == 2,
                timeout=DEADLINE_S,
                every=0.2,
            )
            print(f"\ndrain -> attempt 1 stopped at its checkpoint: {time.monotonic() - at:.1f}s")
            done: dict[str, Any] = wait_for(
                lambda: client.get(f"/runs/{run_id}").json(),
                lambda r: r["status"] in {"SUCCEEDED", "FAILED", "LOST", "STOPPED"},
                timeout=120,
                every=0.3,
            )
            assert done["status"] == "SUCCEEDED", (done["events"], done["attempts"])
            reasons = [e["reason"] for e in done["events"]]
            told = [e["reason"] for e in done["events"] if e["kind"] == "drained"]
            assert len(told) == 1, reasons  # its saves land well before the deadline
            assert told[0].startswith(f"node {worker} is draining (deadline "), told
            assert "asked to stop at its next checkpoint within" in told[0], told
            (end,) = [r for r in reasons if r.startswith(f"draining node {worker}")]
            lost = re.search(r"stopped at checkpoint step (\d+), (\d+) steps lost", end)
            assert lost is not None and lost.group(2) == "0", end
            print(f"stopped at checkpoint step {lost.group(1)}, {lost.group(2)} steps lost")
            assert end.endswith("attempt 2 waits to resume from its checkpoint"), end
            first, second = done["attempts"]
            assert first["status"] == "STOPPED" and second["ray_job_id"] == f"{run_id}-a2"
            assert second["resumed_from_step"] >= int(lost.group(1)), second
            assert transitions(done).count("SUBMITTED") == 2, transitions(done)
            # Elsewhere: Ray schedules nothing on a draining node.
            assert set(actor_nodes(ray, f"{run_id}-a2", "DEAD").values()) == {head}
    finally:
        reader.close()
        ray.stop(holder)
        if drained:  # Ray ended the node once it was idle: a new one takes its place
            ray_cluster.stop_node(1)
            ray_cluster.start_node(1)
