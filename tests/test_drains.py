"""The drains loop, one tick at a time against a Ray in memory: a run with an actor on a node
Ray drains is asked to stop at its next checkpoint before the node's deadline, told once,
with the steps since its last save; one whose saves come too seldom is told what it will
lose; a run elsewhere is left alone. The real drain: tests/test_drain_ray.py."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

from service.cluster.drains import Drain
from service.cluster.registry import Clusters
from service.loops.drains import DrainWatch
from service.store.db import Database
from service.store.lifecycle import request_yield
from service.store.models import Run, RunLog, utcnow
from service.store.status import DRAINING_NODE
from tests.factories import add_run, read_run


class _Ray:
    """What the loop reads of Ray: the jobs, and the actors on a node."""

    token = None

    def __init__(self, actors: dict[str, list[str]]) -> None:
        self.actors = actors  # node -> job ids of its actors

    def all_jobs(self) -> list[dict[str, Any]]:
        return [
            {"submission_id": r, "job_id": f"j-{r}", "driver_node_id": "head"}
            for r in ("r1", "r2", "r3", "r4")
        ]

    def state(self, kind: str, state: str, **equal: str) -> list[dict[str, Any]]:
        assert (kind, state) == ("actors", "ALIVE")
        return [{"job_id": j} for j in self.actors.get(equal["node_id"], [])]


class _Reader:
    address = "gcs:6379"

    def __init__(self, drains: list[Drain]) -> None:
        self.drains = drains

    def draining(self) -> list[Drain]:
        return self.drains

    def close(self) -> None: ...


def test_runs_on_a_draining_node_are_asked_to_save_before_its_deadline(db: Database) -> None:
    now = utcnow()
    for run_id, every in (("r1", 10.0), ("r2", 600.0), ("r3", 10.0), ("r4", 10.0)):
        add_run(
            db,
            run_id,
            checkpoint_step=6,
            checkpoint_at=now - timedelta(seconds=5),
            checkpoint_every_s=every,
        )
    with db.transaction() as s:
        for run_id in ("r1", "r2", "r3", "r4"):
            s.add(RunLog(run_id=run_id, last_step=7))
        cancelled = s.get(Run, "r4")
        assert cancelled is not None
        request_yield(s, cancelled, 600.0, "cancelled by ann")
    ray: Any = _Ray({"n1": ["j-r1", "j-r2", "j-r4"], "n2": ["j-r3"]})
    woken: list[str] = []
    watch = DrainWatch(
        db, Clusters.single(ray), lambda _: "gcs:6379", on_change=lambda: woken.append("r")
    )
    reader = _Reader([Drain("n1", now + timedelta(seconds=60))])
    watch._readers["default"] = reader  # type: ignore[assignment]

    watch.tick()
    watch.tick()  # told once

    assert woken == ["r"]
    r1, said1 = read_run(db, "r1")
    told = [s for s in said1 if "draining" in s]
    assert len(told) == 2, said1  # the drain, and the stop it asks (within 90% of 60 s)
    assert re.fullmatch(
        r"node n1 is draining \(deadline \S+ UTC, in (59|60) s\): asked to stop at its next "
        r"checkpoint within 5[34] s, then it resumes elsewhere \(1 steps since step 6\)",
        told[0],
    ), told
    assert re.fullmatch(
        rf"stop at the next checkpoint requested \(within 5[34] s\): {DRAINING_NODE}n1 "
        r"\(deadline \S+ UTC\)",
        told[1],
    ), told
    assert r1.yield_by is not None and (r1.yield_reason or "").startswith(DRAINING_NODE)
    _, said2 = read_run(db, "r2")
    assert any(
        s.startswith(
            "n1 drains before its next save (saves every 600 s): it will lose the "
            "steps since step 6 (1 now)"
        )
        for s in said2
    ), said2
    r3, said3 = read_run(db, "r3")
    assert r3.yield_by is None and not [s for s in said3 if "drain" in s]
    # A run being cancelled at its next checkpoint stays cancelled, only sooner.
    r4, said4 = read_run(db, "r4")
    assert r4.yield_reason == "cancelled by ann", said4
    assert any("then it ends (cancelled by ann)" in s for s in said4), said4
