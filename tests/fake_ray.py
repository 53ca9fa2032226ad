"""The Ray Jobs client in memory, for unit tests of the loops: no Ray, scriptable answers.

It has what the loops and the inventory use of ``RayJobs`` (submit, get, list_jobs, stop, logs,
tail, cluster_status, version, package_uri, close, all_jobs, state). A test sets a job's status
(``set_status``), its log (``log``), the nodes (``nodes``), jobs submitted outside the service
(``outside_job``) and failures (``fail``: the next calls of a method raise), and reads back what
was asked (``submitted``, ``stopped``).
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime
from pathlib import Path
from typing import Any

from service.cluster.log_tail import LogTail
from service.cluster.ray_jobs import JobInfo, RayJobs

ENDED = {"SUCCEEDED", "FAILED", "STOPPED"}


class FakeRay(RayJobs):
    def __init__(self, nodes: dict[str, dict[str, float]] | None = None) -> None:
        # Not RayJobs.__init__: no HTTP client. Subclassing keeps the interface checked.
        self.address = "fake://ray"
        self.nodes = nodes if nodes is not None else {"n1": {"NPU": 8.0, "CPU": 8.0}}
        self.used: dict[str, dict[str, float]] = defaultdict(dict)
        self.jobs: dict[str, JobInfo] = {}
        self.log: dict[str, str] = {}
        self.submitted: list[dict[str, Any]] = []
        self.stopped: list[str] = []
        # A stop ends the job at once (as if it exited within its grace period).
        self.stop_ends_job = True
        self._failures: dict[str, list[Exception]] = defaultdict(list)
        # Ray's state API rows: alive actors and created placement groups.
        self.actors: list[dict[str, Any]] = []
        self.placement_groups: list[dict[str, Any]] = []
        self.drivers: list[dict[str, Any]] = []
        # ... and dead ones: actors (with their death_cause) and nodes.
        self.dead_actors: list[dict[str, Any]] = []
        self.dead_nodes: list[dict[str, Any]] = []
        self.entrypoints: dict[str, str] = {}

    def fail(self, method: str, exc: Exception, times: int = 1) -> None:
        """The next ``times`` calls of ``method`` raise ``exc``."""
        self._failures[method] += [exc] * times

    def _answer(self, method: str, value: Any) -> Any:
        """``value``, unless a failure is scripted for this call of ``method``."""
        if self._failures[method]:
            raise self._failures[method].pop(0)
        return value

    def set_status(self, run_id: str, status: str, message: str | None = None, **more: Any) -> None:
        """The job's status; ``more``: ``error_type``, ``exit_code`` (the driver's)."""
        error_type, exit_code = more.get("error_type"), more.get("exit_code")
        self.jobs[run_id] = JobInfo(
            run_id, status, message, error_type, exit_code, None, None, job_id=run_id
        )

    def close(self) -> None:
        pass

    def version(self) -> dict[str, Any]:
        return self._answer("version", {"ray_version": "fake"})

    def submit(
        self, submission_id: str, entrypoint: str, runtime_env: dict[str, Any], *_: Any, **__: Any
    ) -> bool:
        self._answer("submit", None)
        fresh = submission_id not in self.jobs  # else Ray's "already exists"
        if fresh:
            job = {"submission_id": submission_id, "entrypoint": entrypoint}
            resources = __.get("entrypoint_resources")
            self.submitted.append(
                job | {"runtime_env": runtime_env, "entrypoint_resources": resources}
            )
            self.set_status(submission_id, "PENDING")
        return fresh

    def cluster_status(self) -> dict[str, Any]:
        self._answer("cluster_status", None)
        usage = {
            node: {r: [self.used[node].get(r, 0.0), total] for r, total in resources.items()}
            for node, resources in self.nodes.items()
        }
        return {"data": {"clusterStatus": {"loadMetricsReport": {"usageByNode": usage}}}}

    def package_uri(self, module_dir: Path) -> str:
        return f"gcs://_ray_pkg_{module_dir.name}.zip"

    def get(self, submission_id: str) -> JobInfo | None:
        return self._answer("get", self.jobs.get(submission_id))

    def list_jobs(self) -> list[JobInfo]:
        return self._answer("list_jobs", list(self.jobs.values()))

    def stop(self, submission_id: str) -> bool:
        self._answer("stop", None)
        self.stopped.append(submission_id)
        job = self.jobs.get(submission_id)
        running = job is not None and job.status not in ENDED
        if running and self.stop_ends_job:
            self.set_status(submission_id, "STOPPED")
        return running

    def outside_job(
        self,
        job_id: str,
        held: dict[str, dict[str, float]],
        kind: str = "SUBMISSION",
        entrypoint: str = "python3 job.py",
        start_time_ms: int | None = None,
    ) -> None:
        """A job sent straight to Ray (or a driver that connected), holding ``held`` (node ->
        resources) in a supervisor actor per node, as Ray's state API shows it."""
        self.entrypoints[job_id] = entrypoint
        if kind == "SUBMISSION":
            self.jobs[job_id] = JobInfo(job_id, "RUNNING", None, None, None, start_time_ms, None)
            actor = f"_ray_internal_job_actor_{job_id}"
        else:
            self.drivers.append(
                {"type": "DRIVER", "job_id": job_id, "status": "RUNNING", "entrypoint": entrypoint}
            )
            actor = "worker"
        for node, resources in held.items():
            self.actors.append(
                {"name": actor, "job_id": job_id, "node_id": node, "required_resources": resources}
            )
        for node, resources in held.items():
            for name, amount in resources.items():
                self.used[node][name] = self.used[node].get(name, 0.0) + amount

    def all_jobs(self) -> list[dict[str, Any]]:
        submissions = [
            {
                "type": "SUBMISSION",
                "submission_id": j.submission_id,
                "job_id": j.submission_id,
                "status": j.status,
                "entrypoint": self.entrypoints.get(j.submission_id, "python3 run.py"),
                "start_time": j.start_time_ms,
            }
            for j in self.jobs.values()
        ]
        return self._answer("all_jobs", submissions + self.drivers)

    def state(self, kind: str, state: str, **equal: str) -> list[dict[str, Any]]:
        nodes = [
            {"node_id": n, "node_ip": f"10.0.0.{i + 1}", "node_name": f"host-{n}"}
            for i, n in enumerate(self.nodes)
        ]
        tables = {"actors": self.actors, "placement_groups": self.placement_groups, "nodes": nodes}
        tables["dead_actors"] = self.dead_actors
        tables["dead_nodes"] = self.dead_nodes
        rows = tables.get(f"dead_{kind}" if state == "DEAD" else kind, [])
        rows = [r for r in rows if all(r.get(k) == v for k, v in equal.items())]
        return self._answer("state", list(rows))

    def logs(self, submission_id: str) -> str | None:
        return self._answer("logs", self.log.get(submission_id))

    def tail(self, submission_id: str, offset: int) -> LogTail:
        return FakeTail(self, submission_id, offset)


class FakeTail(LogTail):
    """A log tail stream without a socket or a thread: each take is the job's log (``logs``)
    past what was taken before; it is complete once the job has ended (its log is then whole)."""

    def __init__(self, ray: FakeRay, run_id: str, offset: int) -> None:
        # Not LogTail.__init__: no connection, no thread.
        self.run_id = run_id
        self._ray = ray
        self._received = offset
        self.missing = False
        self.closed = False

    def take(self) -> str:
        text = self._ray.logs(self.run_id)
        self.missing = text is None
        new = (text or "")[self._received :]
        self._received += len(new)
        return new

    def complete_since(self, seen_ended_at: datetime) -> bool:
        job = self._ray.jobs.get(self.run_id)
        return self.missing or (job is not None and job.status in ENDED)

    def close(self) -> None:
        self.closed = True
