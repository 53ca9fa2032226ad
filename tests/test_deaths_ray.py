"""Ray's state API as a failure's source on the real embedded Ray: a job whose actor died (and
which says nothing of it itself) fails with class ``actor_died``, and what the state API says
of the job names the actor and Ray's death cause for it. Another job waiting meanwhile for a
resource no node has (which Ray's autoscaler would tell every driver) is not the run's cause."""

from __future__ import annotations

import shlex
from collections.abc import Callable

import pytest
from fastapi.testclient import TestClient

from service.cluster.ray_jobs import RayJobs
from service.recovery import deaths
from tests.conftest import TERMINAL, submit, wait_for, wait_status

pytestmark = pytest.mark.ray
# Another team's job: a task that no node can ever hold, waited for.
WAITS = (
    "import ray; ray.init(); ray.get(ray.remote(resources={'never_fits': 1})(lambda: 0).remote())"
)


def test_an_actor_death_only_ray_s_state_api_knows_of_is_the_failure_s_class(
    sqlite_service: Callable[..., TestClient], ray: RayJobs
) -> None:
    with sqlite_service() as client:
        # The job's driver lives on for 20 s after its actor died.
        run_id = submit(client, actor_dies=True, exit_code=1, seconds=20)
        wait_for(lambda: ray.logs(run_id) or "", lambda log: "carries on" in log)
        # Meanwhile another job's task waits for a resource no node has: Ray's autoscaler tells
        # every live driver within a round (5 s). The ray fixture stops that job at the end.
        ray.submit("another-team-waits", f"python3 -c {shlex.quote(WAITS)}", {}, {})
        wait_status(client, run_id, TERMINAL)
        # The failure is settled once the log is read to the end.
        run = wait_for(lambda: client.get(f"/runs/{run_id}").json(), lambda r: r["failure"])
    assert run["status"] == "FAILED", run
    assert run["failure"]["class"] == "actor_died", run["failure"]
    assert "never_fits" not in (ray.logs(run_id) or "")
    # Ray prints the worker's death into the driver's log too (the evidence above); its state
    # API, which the classifier reads after the log, says it with the cause.
    (line,) = deaths.read(ray, run_id).lines
    # Ray's word on why: the death cause's context and reason, then its messages.
    assert line.startswith(
        "Ray's state API: actor Dying died (actor_died_error_context, WORKER_DIED): "
    ), line
    assert "worker process has died" in line or "exit" in line.lower(), line
