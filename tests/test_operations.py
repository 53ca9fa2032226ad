"""The runs service without HTTP: accept, replay, plan, cancel and the cluster view called with
plain inputs (a principal, a spec body, the replica's parts), on a real database."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from sqlalchemy import func, select

from service.cluster.registry import Clusters
from service.errors import Conflict, Forbidden, InvalidSpec
from service.operations import accept, cancel
from service.operations.cluster_view import cluster_view
from service.principal import Principal
from service.recipes.registry import RecipeRegistry, default_registry
from service.scheduling.inventory import Inventory, Node
from service.settings import Settings
from service.store import audit
from service.store.db import Database
from service.store.models import Run
from service.team_secrets import SecretStore
from tests.fake_ray import FakeRay

MEMBER = Principal(user="alice", team="vision", role="member", token_id="tok_a")
OTHER = Principal(user="bob", team="speech", role="member", token_id="tok_b")


@dataclass
class Parts:
    """What the operations run on, without a server: no loops, a set inventory."""

    settings: Settings
    db: Database
    registry: RecipeRegistry
    secrets: SecretStore
    inventory: Inventory | None = None
    woken: list[str] = field(default_factory=list)
    clusters: Clusters = field(default_factory=lambda: Clusters.single(FakeRay()))

    def cluster(self, name: str | None = None) -> Inventory | None:
        return self.inventory

    def wake(self, name: str) -> None:
        self.woken.append(name)


@pytest.fixture
def parts(db: Database, tmp_path: object) -> Parts:
    settings = Settings(
        database_url=db.engine.url.render_as_string(hide_password=False),
        run_loops=False,
        recipe_plugins="tests.recipes:register",
    )
    registry = default_registry(settings.recipe_plugins, settings)
    return Parts(settings, db, registry, SecretStore(settings.secrets_dir))


def runs(db: Database) -> int:
    with db.read() as session:
        return int(session.scalar(select(func.count()).select_from(Run)) or 0)


def test_a_run_is_accepted_once_per_key_and_cancelled(parts: Parts) -> None:
    body = {"recipe": "test-script"}
    done = accept.accept_run(parts, MEMBER, body, "k1", "10.0.0.1:5000")
    assert (done.doc["status"], done.doc["team"], done.replayed) == ("QUEUED", "vision", False)
    assert parts.woken == ["submitter"]
    again = accept.accept_run(parts, MEMBER, body, "k1", "10.0.0.1:5001")
    assert (again.run_id, again.replayed) == (done.run_id, True)
    assert runs(parts.db) == 1 and parts.woken == ["submitter"]
    with pytest.raises(Conflict):
        accept.accept_run(parts, MEMBER, body | {"name": "other"}, "k1", None)
    # Another caller's equal key is another key.
    assert accept.accept_run(parts, OTHER, body, "k1", None).run_id != done.run_id

    cancelled = cancel.cancel_run(parts, MEMBER, done.run_id, "10.0.0.1:5002")
    assert cancelled["status"] == "CANCELLED"
    assert [e["to_status"] for e in cancelled["events"]] == ["QUEUED", "CANCELLED"]
    with pytest.raises(Conflict):
        cancel.cancel_run(parts, MEMBER, done.run_id, None)
    with parts.db.read() as session:
        trail = audit.page(session, 10, None, done.run_id)
    assert [(r.action, r.client) for r in trail] == [
        ("run.cancel", "10.0.0.1:5002"),
        ("run.create", "10.0.0.1:5000"),
    ]


def test_the_team_and_priority_are_the_principals(parts: Parts) -> None:
    with pytest.raises(Forbidden):
        accept.accept_run(parts, MEMBER, {"recipe": "test-script", "team": "speech"}, None, None)
    with pytest.raises(Forbidden):
        accept.plan_run(parts, MEMBER, {"recipe": "test-script", "priority": "high"})
    assert runs(parts.db) == 0


def test_a_shape_that_never_fits_is_refused_and_planned_as_such(parts: Parts) -> None:
    parts.inventory = Inventory((Node("n1", {"NPU": 8.0, "CPU": 32.0}, {"NPU": 8.0, "CPU": 32.0}),))
    body = {"recipe": "test-script", "npus": 16}
    with pytest.raises(InvalidSpec):
        accept.accept_run(parts, MEMBER, body, None, None)
    plan = accept.plan_run(parts, MEMBER, body)
    assert plan["dry_run"] is True and plan["command"][0] == "python3"
    assert plan["plan"]["feasible_ever"] is False and plan["plan"]["errors"]
    assert accept.plan_run(parts, MEMBER, body | {"npus": 8})["plan"]["feasible_ever"] is True
    assert runs(parts.db) == 0 and parts.woken == []


def test_the_cluster_view_hides_another_teams_names(parts: Parts) -> None:
    accept.accept_run(parts, MEMBER, {"recipe": "test-script", "name": "mine"}, None, None)
    mine = cluster_view(parts, MEMBER, None)
    theirs = cluster_view(parts, OTHER, None)
    assert mine["ray"] == {"ok": False} and mine["nodes"] == []
    assert [q["name"] for q in mine["queue"]] == ["mine"]
    assert [(q["team"], q["name"]) for q in theirs["queue"]] == [("vision", None)]
