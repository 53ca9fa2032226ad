"""Budgets: a team past its accelerator-hours this month has its new runs wait with the reason,
others' runs start, and an admin may let one through (audited)."""

from __future__ import annotations

import re
from datetime import timedelta

from fastapi.testclient import TestClient
from sqlalchemy import select

from service import usage
from service.app import create_app
from service.cluster.inventory_cache import InventoryCache
from service.loops.submitter import Submitter
from service.scheduling.admission import Quotas
from service.scheduling.budgets import Budgets
from service.store.db import Database
from service.store.models import AuditEntry, utcnow
from service.store.status import RunStatus
from service.store.tokens import create as create_token
from tests.conftest import make_settings
from tests.factories import add_run, new_run, read_run
from tests.fake_ray import FakeRay

NODES = {f"n{i}": {"NPU": 8.0, "CPU": 8.0} for i in range(3)}
OVER = re.compile(r"^budget: team nlp used (\d+) of 2 NPU-hours this month$")


def used_this_month(db: Database, team: str, npus: int, hours: float) -> None:
    """An ended run of ``team`` that held ``npus`` for ``hours`` (at most since the month began)."""
    now = utcnow()
    start = max(now - timedelta(hours=hours), now.replace(day=1, hour=0, minute=0, second=0))
    with db.transaction() as s:
        run = new_run(f"old-{team}", RunStatus.SUCCEEDED, team=team, npus=npus)
        run.submitted_at = start
        s.add(run)
        s.flush()
        usage.accrue(s, run, now)


def submitter(db: Database, ray: FakeRay, budgets: Budgets) -> Submitter:
    return Submitter(db, ray, InventoryCache(ray, 0.0), Quotas(), "me", 30.0, 10, budgets=budgets)


def test_a_team_past_its_budget_waits_with_the_reason_while_another_team_starts(
    db: Database,
) -> None:
    ray = FakeRay(NODES)
    used_this_month(db, "nlp", 8, 0.5)  # 4 NPU-hours, or all the month has had
    add_run(db, "r1", RunStatus.QUEUED, team="nlp", npus=8)
    add_run(db, "r2", RunStatus.QUEUED, team="vision", npus=8)
    add_run(db, "r3", RunStatus.QUEUED, team="speech", npus=8)
    budgets = Budgets({"nlp": 2, "vision": 100})
    submitter(db, ray, budgets).tick()
    assert sorted(s["submission_id"] for s in ray.submitted) == ["r2", "r3"]
    run, _ = read_run(db, "r1")
    assert run.status == RunStatus.QUEUED
    assert run.queue_reason is not None and OVER.match(run.queue_reason), run.queue_reason
    # Under its budget a team's runs are admitted as before.
    submitter(db, ray, Budgets({"nlp": 10_000})).tick()
    assert read_run(db, "r1")[0].status == RunStatus.SUBMITTED


def test_an_admin_lets_a_run_through_its_team_s_budget_and_it_is_audited(
    db_url: str, db: Database
) -> None:
    used_this_month(db, "nlp", 8, 0.5)
    add_run(db, "r1", RunStatus.QUEUED, team="nlp", npus=8)
    add_run(db, "r2", RunStatus.RUNNING, team="nlp", npus=8)
    with db.transaction() as s:
        _, member = create_token(s, "ann", "nlp", "member")
        _, admin = create_token(s, "root", "ops", "admin")
    settings = make_settings(db_url, "http://127.0.0.1:9", run_loops=False, auth="on")
    with TestClient(create_app(settings)) as api:
        as_member = {"Authorization": f"Bearer {member}"}
        as_admin = {"Authorization": f"Bearer {admin}"}
        assert api.post("/runs/r1/admit-over-budget", headers=as_member).status_code == 403
        assert api.post("/runs/r2/admit-over-budget", headers=as_admin).status_code == 409
        resp = api.post("/runs/r1/admit-over-budget", headers=as_admin)
        assert resp.status_code == 200, resp.text
    with db.read() as s:
        actions = s.execute(
            select(AuditEntry.user, AuditEntry.action, AuditEntry.run_id).where(
                AuditEntry.action == "run.admit_over_budget"
            )
        ).all()
    assert [tuple(a) for a in actions] == [("root", "run.admit_over_budget", "r1")]
    assert read_run(db, "r1")[0].over_budget_by == "root"
    ray = FakeRay(NODES)
    submitter(db, ray, Budgets({"nlp": 2})).tick()
    assert [s["submission_id"] for s in ray.submitted] == ["r1"]


def test_a_dry_run_of_a_team_past_its_budget_says_it_would_wait_and_why(
    db_url: str, db: Database
) -> None:
    used_this_month(db, "nlp", 8, 0.5)
    settings = make_settings(db_url, "http://127.0.0.1:9", run_loops=False, team_budgets={"nlp": 2})
    with TestClient(create_app(settings)) as api:
        body = {"recipe": "test-script", "npus": 8}
        plan = api.post("/runs?dry_run=true", json=body | {"team": "nlp"}).json()["plan"]
        assert plan["feasible_now"] is False
        assert len(plan["reasons"]) == 1 and OVER.match(plan["reasons"][0]), plan["reasons"]
        other = api.post("/runs?dry_run=true", json=body | {"team": "vision"}).json()["plan"]
        assert not any(r.startswith("budget") for r in other["reasons"])


def test_a_run_waiting_for_its_team_s_budget_says_by_how_much_in_the_api_and_the_cli(
    db_url: str, db: Database
) -> None:
    import httpx
    from typer.testing import CliRunner

    from service.cli import app as cli
    from tests.live import ServerThread

    used_this_month(db, "nlp", 8, 0.5)
    add_run(db, "r1", RunStatus.QUEUED, team="nlp", npus=8)
    add_run(db, "r2", RunStatus.QUEUED, team="vision", npus=16)  # more than the cluster has
    submitter(db, FakeRay(NODES), Budgets({"nlp": 2})).tick()
    settings = make_settings(db_url, "http://127.0.0.1:9", run_loops=False)
    with ServerThread(create_app(settings)) as url, httpx.Client(base_url=url) as api:
        month = api.get("/usage", params={"group_by": "team"}).json()["rows"]
        used = next(r["accelerator_hours"] for r in month if r["team"] == "nlp")
        wait = api.get("/runs/r1").json()["budget_wait"]
        assert wait == {
            "month": utcnow().strftime("%Y-%m"),
            "used_hours": round(used, 1),
            "budget_hours": 2.0,
            "over_by_hours": round(used - 2, 1),
            "accelerator": "NPU",
        }
        # A run that waits for capacity, not budget, says nothing of a budget.
        r2 = api.get("/runs/r2").json()
        assert r2["queue_reason"] and r2["budget_wait"] is None
        shown = CliRunner().invoke(cli, ["status", "r1", "--server", url])
        assert shown.exit_code == 0, shown.output
        said = f"waits for budget: {used - 2:,.1f} NPU-hours over (used {used:,.1f} of 2 in"
        assert said in shown.output
        # Let through, it no longer waits for budget (but for capacity: there is no node).
        doc = api.post("/runs/r1/admit-over-budget").json()
        assert (doc["budget_wait"], doc["over_budget_by"]) == (None, "anonymous")
        submitter(db, FakeRay({}), Budgets({"nlp": 2})).tick()
        shown = CliRunner().invoke(cli, ["status", "r1", "--server", url])
        assert "waits for budget" not in shown.output
        assert "let through its team's budget by anonymous" in shown.output
    assert read_run(db, "r1")[0].budget_wait is None
