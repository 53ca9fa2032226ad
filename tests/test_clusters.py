"""Several clusters against in-memory Rays: the clusters file, which clusters a run may use,
admission across them, a cluster that goes down (its runs LOST or retried elsewhere) and comes
back, and ``GET /clusters``."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from service.app import create_app
from service.clock import utcnow
from service.cluster.inventory_cache import InventoryCache
from service.cluster.ray_jobs import RayUnavailable
from service.cluster.registry import ClusterHandle, Clusters, Health
from service.cluster.spec import ClustersFileError, ClusterSpec, LocalShape, declared, load
from service.errors import InvalidSpec
from service.loops.cluster_health import ClusterHealth
from service.loops.follower import Follower
from service.loops.reconciler import Reconciler
from service.loops.submitter import Submitter
from service.metrics.health import HealthRules
from service.recovery.retry import RetryConfig
from service.scheduling.admission import Quotas
from service.settings import Settings
from service.store.db import Database
from service.store.models import AuditEntry, MetricKey, Run, RunLog
from service.store.status import RunStatus
from tests.conftest import make_settings
from tests.factories import add_run, read_run
from tests.fake_ray import FakeRay

ONE_NODE = {"a1": {"NPU": 8.0, "CPU": 16.0}}
TWO_NODES = {"b1": {"NPU": 8.0, "CPU": 16.0}, "b2": {"NPU": 8.0, "CPU": 16.0}}
CLUSTERS_YAML = """\
clusters:
  - name: small
    address: http://127.0.0.1:9
    accelerator: NPU
    labels: {site: hz}
    verl_versions: ["0.9.1"]
  - name: big
    address: http://127.0.0.1:9
    accelerator: NPU
    labels: {site: sh}
    teams: [vision]
"""


def _spec(name: str, **more: Any) -> ClusterSpec:
    return ClusterSpec(name=name, address=f"http://{name}:8265", accelerator="NPU", **more)


def _clusters(**rays: tuple[FakeRay, dict[str, Any]]) -> Clusters:
    return Clusters(
        [
            ClusterHandle(_spec(name, **more), ray, InventoryCache(ray, 0.0))
            for name, (ray, more) in rays.items()
        ]
    )


def test_a_clusters_file_is_read_into_validated_specs(tmp_path: Path) -> None:
    path = tmp_path / "clusters.yaml"
    path.write_text(CLUSTERS_YAML)
    small, big = load(path)
    assert (small.name, small.labels, small.teams, small.verl_versions) == (
        "small",
        {"site": "hz"},
        None,
        ["0.9.1"],
    )
    assert big.teams == ["vision"] and big.admits_team("vision") and not big.admits_team("nlp")
    assert [c.name for c in declared(Settings(clusters_file=str(path)))] == ["small", "big"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "clusters:\n  - {name: a, local: {npus: [8]}}\n  - {name: B!, local: {npus: [8]}}\n",
            "clusters.1.name",
        ),
        (
            "clusters:\n  - name: a\n    address: http://h:8265\n    local: {npus: [8]}\n",
            "clusters.0: Value error, give exactly one of `address`",
        ),
        ("clusters:\n  - name: a\n    address: h:8265\n", "clusters.0.address"),
        (
            "clusters:\n  - {name: a, local: {npus: [8]}}\n  - {name: a, local: {npus: [8]}}\n",
            "cluster name 'a' is declared twice",
        ),
        ("clusters:\n  - {name: a, local: {npus: [8]}, token: hunter2}\n", "clusters.0.token"),
        ("clusters:\n  - {name: a, local: {npus: [8]}, colour: red}\n", "clusters.0.colour"),
        ("clusters: []\n", "clusters: List should have at least 1 item"),
        ("clusters: [", "while parsing"),
    ],
)
def test_a_bad_clusters_file_is_refused_with_the_path_of_the_field(
    tmp_path: Path, text: str, message: str
) -> None:
    path = tmp_path / "clusters.yaml"
    path.write_text(text)
    with pytest.raises(ClustersFileError) as caught:
        load(path)
    assert str(caught.value).startswith(f"clusters file {path}: ")
    assert message in str(caught.value)


def test_a_bad_clusters_file_stops_the_service_at_start(tmp_path: Path, db_url: str) -> None:
    path = tmp_path / "clusters.yaml"
    path.write_text("clusters:\n  - name: a\n")
    app = create_app(make_settings(db_url, "http://127.0.0.1:9", clusters_file=str(path)))
    with pytest.raises(ClustersFileError, match=r"clusters\.0: Value error"), TestClient(app):
        pass


def test_without_a_file_the_one_cluster_is_default_at_the_ray_address() -> None:
    (remote,) = declared(Settings(ray_address="http://head:8265"))
    assert (remote.name, remote.address, remote.local) == ("default", "http://head:8265", None)
    (local,) = declared(Settings(ray_address="local", local_npus=[8, 8]))
    assert local.local == LocalShape(npus=[8, 8], cpus_per_node=64)


def test_a_run_may_use_only_the_clusters_its_team_selector_and_verl_version_allow() -> None:
    clusters = Clusters.single(FakeRay())
    clusters = _clusters(
        small=(FakeRay(), {"labels": {"site": "hz"}, "verl_versions": ["0.9.1"]}),
        big=(FakeRay(), {"labels": {"site": "sh"}, "teams": ["vision"]}),
    )
    assert clusters.candidates("vision") == ["small", "big"]
    assert clusters.candidates("nlp") == ["small"]
    assert clusters.candidates("vision", labels={"site": "sh"}) == ["big"]
    assert clusters.candidates("vision", verl_version="0.9.2") == ["big"]
    cases: list[tuple[dict[str, Any], str, str]] = [
        ({"team": "nlp", "cluster": "big"}, "cluster", "team 'nlp' may not use cluster 'big'"),
        ({"team": "nlp", "cluster": "nope"}, "cluster", "no cluster 'nope'"),
        ({"team": "nlp", "cluster": "small", "verl_version": "0.9.2"}, "cluster", "verl 0.9.2"),
        ({"team": "nlp", "accelerator": "GPU"}, "placement.accelerator", "no cluster of GPU"),
        ({"team": "nlp", "labels": {"site": "sh"}}, "placement.labels.site", "site=sh"),
    ]
    rooted = _clusters(
        hz=(FakeRay(), {"data_roots": ["/data", "hdfs://nn/sets"]}),
        sh=(FakeRay(), {"data_roots": ["/mnt/data"]}),
        any=(FakeRay(), {}),
    )
    assert rooted.candidates("t", reads=["/data/geo3k/train.parquet"]) == ["hz", "any"]
    assert rooted.candidates("t", reads=["hdfs://nn/sets/a", "/mnt/data/b"]) == ["any"]
    assert rooted.candidates("t", reads=["/data/../etc/passwd"]) == ["any"]
    clusters = _clusters(
        small=(FakeRay(), {"labels": {"site": "hz"}, "verl_versions": ["0.9.1"]}),
        big=(FakeRay(), {"labels": {"site": "sh"}, "teams": ["vision"], "data_roots": ["/d"]}),
    )
    cases += [
        ({"team": "vision", "cluster": "big", "reads": ["/x/y"]}, "cluster", "/x/y"),
        ({"team": "vision", "labels": {"site": "sh"}, "reads": ["/x/y"]}, "data", "/x/y"),
    ]
    for asked, field, words in cases:
        with pytest.raises(InvalidSpec) as caught:
            clusters.candidates(**asked)
        error = caught.value.extra["errors"][0]
        assert error["field"] == field and words in error["msg"], asked


def test_admission_places_each_run_on_a_cluster_that_can_hold_it(db: Database) -> None:
    small, big = FakeRay(ONE_NODE), FakeRay(TWO_NODES)
    clusters = _clusters(small=(small, {}), big=(big, {}))
    loop = Submitter(db, clusters, None, Quotas(), "me", 30.0, 10)
    # 16 NPUs never fit one 8-NPU node: only the big cluster holds it.
    add_run(db, "r1", RunStatus.QUEUED, npus=8, launch=_two_groups(8))
    add_run(db, "r2", RunStatus.QUEUED, npus=1, launch=_two_groups(1))
    loop.tick()
    assert [j["submission_id"] for j in big.submitted] == ["r1"]
    assert [j["submission_id"] for j in small.submitted] == ["r2"]
    assert read_run(db, "r1")[0].cluster == "big" and read_run(db, "r2")[0].cluster == "small"


def test_a_cluster_s_own_quota_sends_a_team_s_run_to_another(db: Database) -> None:
    small, big = FakeRay(ONE_NODE), FakeRay(TWO_NODES)
    clusters = _clusters(small=(small, {"quotas": {"t": 1}}), big=(big, {}))
    loop = Submitter(db, clusters, None, Quotas(), "me", 30.0, 10)
    add_run(db, "r1", RunStatus.QUEUED, launch=_two_groups(1))
    loop.tick()
    assert small.submitted == [] and read_run(db)[0].cluster == "big"


def test_a_run_that_names_a_cluster_waits_for_it_and_a_down_cluster_admits_nothing(
    db: Database,
) -> None:
    small, big = FakeRay(ONE_NODE), FakeRay(TWO_NODES)
    clusters = _clusters(small=(small, {}), big=(big, {}))
    loop = Submitter(db, clusters, None, Quotas(), "me", 30.0, 10)
    clusters.of("big").health = Health(up=False)
    add_run(db, "r1", RunStatus.QUEUED, launch=_two_groups(1, where={"cluster": "big"}))
    add_run(db, "r2", RunStatus.QUEUED, launch=_two_groups(1))
    loop.tick()
    assert big.submitted == [] and [j["submission_id"] for j in small.submitted] == ["r2"]
    run, _ = read_run(db, "r1")
    assert run.status == RunStatus.QUEUED and run.queue_reason is not None
    assert run.queue_reason.startswith("waits for big: cluster down since ")


class _Loops:
    """Submitter, reconciler, follower and the health loop over two in-memory clusters."""

    def __init__(self, db: Database, retry: RetryConfig | None = None) -> None:
        self.small, self.big = FakeRay(ONE_NODE), FakeRay(TWO_NODES)
        self.clusters = _clusters(small=(self.small, {}), big=(self.big, {}))
        self.submitter = Submitter(db, self.clusters, None, Quotas(), "me", 30.0, 10)
        self.reconciler = Reconciler(db, self.clusters, retry_config=retry or RetryConfig())
        self.follower = Follower(
            db, self.clusters, "me", 30.0, 10_000, HealthRules(), retry=retry or RetryConfig()
        )
        self.start = self.now = utcnow()
        self.health = ClusterHealth(
            db, self.clusters, 6.0, retry=retry or RetryConfig(), clock=lambda: self.now
        )

    def probe(self, at_s: float, big_answers: bool) -> None:
        """One round of the health loop, ``at_s`` seconds into the test."""
        if not big_answers:
            self.big.fail("version", RayUnavailable("connection refused"))
        self.now = self.start + timedelta(seconds=at_s)
        self.health.tick()


def _running_on_big(db: Database, loops: _Loops, spec: dict[str, Any] | None = None) -> None:
    add_run(db, "r1", RunStatus.QUEUED, spec=spec or {}, launch=_two_groups(8))
    loops.submitter.tick()
    loops.big.set_status("r1", "RUNNING")
    loops.reconciler.tick()
    loops.follower.tick()
    assert read_run(db, "r1")[0].status == RunStatus.RUNNING


def test_a_blip_downs_nothing_and_a_head_silent_for_the_window_loses_its_runs(
    db: Database,
) -> None:
    loops = _Loops(db)
    _running_on_big(db, loops)
    loops.probe(0, big_answers=False)
    loops.probe(1, big_answers=True)  # one failed probe, then an answer: a blip
    loops.probe(2, big_answers=False)
    loops.probe(7, big_answers=False)  # silent for less than 6 s... (2 -> 7: 5 s)
    assert loops.clusters.of("big").health.up
    loops.probe(8, big_answers=False)  # ... now 6 s
    assert not loops.clusters.of("big").health.up
    run, reasons = read_run(db)
    assert run.status == RunStatus.LOST and reasons[-1] == "cluster big down"
    assert run.failure is not None and run.failure["class"] == "cluster_down"
    # The other loops leave its runs alone while it is down; it comes back at its answer.
    loops.reconciler.tick()
    loops.follower.tick()
    loops.probe(9, big_answers=True)
    assert loops.clusters.of("big").health.up
    # Its head was cut off, not restarted: the job of the run that ended is stopped there.
    assert loops.big.stopped == ["r1"]
    with db.read() as s:
        actions = s.scalars(select(AuditEntry.action).where(AuditEntry.target == "big")).all()
    assert "cluster.down" in actions


def test_a_run_whose_policy_names_cluster_down_is_retried_on_another_cluster(
    db: Database,
) -> None:
    loops = _Loops(db)
    policy: dict[str, Any] = {"retry": {"max_attempts": 2, "on": ["cluster_down"], "backoff_s": 0}}
    add_run(db, "r1", RunStatus.QUEUED, spec=policy, launch=_two_groups(1))
    loops.clusters.of("small").health = Health(up=False)  # r1 goes to big
    loops.submitter.tick()
    loops.clusters.of("small").health = Health()
    assert read_run(db)[0].cluster == "big"
    loops.big.set_status("r1", "RUNNING")
    loops.reconciler.tick()
    loops.probe(0, big_answers=False)
    loops.probe(7, big_answers=False)
    run, reasons = read_run(db)
    assert (run.status, run.attempt) == (RunStatus.QUEUED, 2)
    assert "retrying: attempt 2 of 2 after cluster_down" in reasons
    loops.submitter.tick()
    assert [j["submission_id"] for j in loops.small.submitted] == ["r1-a2"]
    assert read_run(db)[0].cluster == "small"
    # Each job was submitted once, each on one cluster; back, big stops the first attempt.
    assert [j["submission_id"] for j in loops.big.submitted] == ["r1"]
    loops.probe(8, big_answers=True)
    assert loops.big.stopped == ["r1"] and loops.small.stopped == []


def test_get_clusters_lists_each_with_health_capacity_and_who_may_use_it(
    tmp_path: Path, db_url: str
) -> None:
    path = tmp_path / "clusters.yaml"
    path.write_text(CLUSTERS_YAML)
    settings = make_settings(db_url, "http://127.0.0.1:9", run_loops=False, clusters_file=str(path))
    with TestClient(create_app(settings)) as client:
        services = client.app.state.services  # type: ignore[attr-defined]
        fake = FakeRay(TWO_NODES)
        services.clusters.of("big").inventory = InventoryCache(fake, 0.0)
        services.clusters.of("small").health = Health(up=False)
        doc = client.get("/clusters").json()
        small, big = doc["clusters"]
        assert (small["name"], small["health"]["up"], small["capacity"]) == ("small", False, None)
        assert big["health"]["up"] and big["capacity"] == {"NPU": {"total": 16.0, "free": 16.0}}
        assert big["teams"] == ["vision"] and big["labels"] == {"site": "sh"}
        assert small["verl_versions"] == ["0.9.1"] and big["nodes"] == 2
        # Readiness reports each cluster apart: the primary as `ray`, the others by name.
        checks = client.get("/readyz").json()["checks"]
        assert set(checks) == {"database", "ray", "ray:big"} and not checks["ray:big"]["ok"]
        # The plan of a run that may go to either: planned on the one that can hold it.
        body = {"recipe": "test-script", "team": "vision", "groups": [{"accelerators": 8}] * 2}
        plan = client.post("/runs?dry_run=true", json=body).json()["plan"]
        assert (plan["cluster"], plan["feasible_ever"]) == ("big", True)
        assert {c["name"]: c["down"] is not None for c in plan["clusters"]} == {
            "small": True,
            "big": False,
        }
        # Naming a cluster the team may not use is refused at the field.
        answer = client.post(
            "/runs", json={"recipe": "test-script", "team": "nlp", "cluster": "big"}
        )
        assert answer.status_code == 422
        assert answer.json()["errors"][0]["field"] == "cluster"
        with services.db.read() as s:
            assert s.scalars(select(Run)).all() == []


def _two_groups(npus: int, where: dict[str, Any] | None = None) -> dict[str, Any]:
    """The launch of a run with a trainer and a rollout group of ``npus`` each."""
    from service.recipes.base import Launch
    from service.scheduling.shape import Group, ResourceShape

    groups = (Group("trainer", npus, 0.0), Group("rollout", npus, 0.0))
    launch = Launch(["true"], {}, ResourceShape(groups=groups, driver_cpus=0.1)).as_dict()
    return launch | {"where": where or {}}


def test_two_replicas_share_the_runs_of_every_cluster_by_their_follower_leases(
    db: Database,
) -> None:
    small, big = FakeRay(ONE_NODE), FakeRay(TWO_NODES)
    clusters = _clusters(small=(small, {}), big=(big, {}))
    runs = {"r1": small, "r2": big, "r3": small, "r4": big}
    for run_id, ray in runs.items():
        cluster = "small" if ray is small else "big"
        add_run(db, run_id, RunStatus.RUNNING, cluster=cluster)
        ray.set_status(run_id, "RUNNING")
        ray.log[run_id] = f"step:1 - {run_id}/score:1.0\n"
    # Replicas started together take at most claim_new unheld runs each a tick.
    replicas = [
        Follower(db, clusters, owner, 30.0, 10_000, HealthRules(), claim_new=2)
        for owner in ("one", "two")
    ]
    for replica in replicas:
        replica.tick()
    with db.read() as s:
        leases = dict(s.execute(select(RunLog.run_id, RunLog.lease_owner)).tuples().all())
    assert leases == {"r1": "one", "r2": "one", "r3": "two", "r4": "two"}
    # Each replica holds runs of both clusters.
    for owner in ("one", "two"):
        mine = {runs[r] is small for r, o in leases.items() if o == owner}
        assert mine == {True, False}
    # Each run's log was read from its own cluster, whichever replica holds it.
    with db.read() as s:
        keys = dict(s.execute(select(MetricKey.run_id, MetricKey.key)).tuples().all())
    assert keys == {run_id: f"{run_id}/score" for run_id in runs}


def test_a_verl_run_carries_the_paths_it_reads_for_the_clusters_data_roots() -> None:
    from tests.test_verl_recipe import PRESET, build

    reads = build(PRESET).reads
    assert {"/mnt/data/geo3k/train.parquet", "/mnt/models/Qwen3-VL-8B-Instruct"} <= set(reads)
    assert not [p for p in reads if p.startswith("/mnt/ckpt/")]  # its own dir is its own
    clusters = _clusters(
        hz=(FakeRay(), {"data_roots": ["/mnt/data", "/mnt/models"]}),
        sh=(FakeRay(), {"data_roots": ["/data"]}),
    )
    assert clusters.candidates("t", reads=reads) == ["hz"]
