"""For a test that moves a tiny-grpo run between the session cluster's two nodes: where the
run's actors are, and a job that holds the head's NPUs so the run is placed on the other node."""

from __future__ import annotations

import uuid

from service.cluster.ray_jobs import RayJobs
from tests.conftest import wait_for

ACTORS = {"TinyGrpoTrainer", "TinyGrpoRollouter"}


def actor_nodes(ray: RayJobs, submission_id: str, state: str) -> dict[str, str]:
    """The node of each of the job's actors in ``state``, by the actor's class."""
    info = ray.get(submission_id)
    if info is None or not info.job_id:
        return {}
    actors = ray.state("actors", state, job_id=info.job_id)
    return {a["class_name"]: a["node_id"] for a in actors if a["class_name"] in ACTORS}


def hold_head(ray: RayJobs) -> str:
    """A job outside the service that holds the head's 8 NPUs, once it runs: its id."""
    holder = f"hold-head-{uuid.uuid4().hex[:8]}"
    ray.submit(
        holder,
        "sleep 600",
        {},
        {},
        entrypoint_num_cpus=0.01,
        entrypoint_resources={"NPU": 8.0, "node:__internal_head__": 0.001},
    )
    wait_for(lambda: ray.get(holder), lambda j: j is not None and j.status == "RUNNING")
    return holder
