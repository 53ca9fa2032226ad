"""A baseline per team and recipe: pinned (replacing the one before) and unpinned by a member of
the run's team, audited; every other run of that team and recipe shows its difference from it
at the same step (reward, response length, step time) in the run list, the run and
``rlrun list``; a viewer may not pin, another team does not see the run."""

from __future__ import annotations

from sqlalchemy import select

from service.cli.runs import versus
from service.metrics import store
from service.metrics.keys import RESPONSE_LENGTH_KEY, REWARD_KEY, STEP_TIME_KEY
from service.metrics.parse import MetricLine
from service.store.db import Database
from service.store.models import AuditEntry
from service.store.status import RunStatus
from service.wire.runs import RunSummary
from tests.conftest import auth_on
from tests.factories import add_run


def _runs(db_url: str) -> None:
    db = Database(db_url)
    try:
        for run_id in ("base", "other", "elsewhere"):
            recipe = "y" if run_id == "elsewhere" else "x"
            add_run(db, run_id, RunStatus.RUNNING, team="vision", recipe=recipe)
        with db.transaction() as s:
            # The baseline logged steps 1..5; the other run 1..3, higher reward, longer answers.
            for step in range(1, 6):
                values = {REWARD_KEY: 0.1 * step, RESPONSE_LENGTH_KEY: 100.0, STEP_TIME_KEY: 10.0}
                store.add_lines(s, "base", [(step, MetricLine(step, values))])
            for step in range(1, 4):
                values = {REWARD_KEY: 0.1 * step + 0.05, RESPONSE_LENGTH_KEY: 120.0}
                store.add_lines(s, "other", [(step, MetricLine(step, values))])
            store.add_lines(s, "elsewhere", [(1, MetricLine(1, {REWARD_KEY: 0.9}))])
    finally:
        db.dispose()


def test_pinned_baseline_gives_every_other_run_its_difference_at_the_same_step(
    db_url: str,
) -> None:
    users = ("m", "vision", "member"), ("v", "vision", "viewer"), ("o", "speech", "member")
    with auth_on(db_url, *users) as (client, [(_, member), (_, viewer), (_, outsider)]):
        _runs(db_url)
        as_member = {"Authorization": f"Bearer {member}"}
        # A viewer may not pin; another team's member does not see the run.
        assert (
            client.put(
                "/runs/base/baseline", headers={"Authorization": f"Bearer {viewer}"}
            ).status_code
            == 403
        )
        assert (
            client.put(
                "/runs/base/baseline", headers={"Authorization": f"Bearer {outsider}"}
            ).status_code
            == 404
        )
        pinned = client.put("/runs/base/baseline", headers=as_member)
        assert pinned.status_code == 200, pinned.text
        assert pinned.json() | {"pinned_at": None} == {
            "team": "vision",
            "recipe": "x",
            "run_id": "base",
            "pinned_by": "m",
            "pinned_at": None,
        }
        page = client.get("/runs?baseline=true", headers=as_member).json()
        items = {r["id"]: r for r in page["items"]}
        assert items["base"]["baseline"]["is_baseline"] is True
        assert items["elsewhere"]["baseline"] is None  # another recipe: not compared
        other = items["other"]["baseline"]
        assert other["run_id"] == "base" and not other["is_baseline"]
        assert other["reward"]["step"] == other["reward"]["baseline_step"] == 3
        assert abs(other["reward"]["difference"] - 0.05) < 1e-9
        assert other["response_length"]["difference"] == 20.0
        assert other["step_time"] is None  # the other run never logged its step time
        run = client.get("/runs/other?baseline=true", headers=as_member).json()
        assert run["baseline"] == other
        # Unasked, the run and the list read no baseline (their queries stay as few).
        assert client.get("/runs/other", headers=as_member).json()["baseline"] is None
        assert versus(RunSummary.model_validate(items["other"])) == "reward +0.05, len +20"
        assert versus(RunSummary.model_validate(items["base"])) == "baseline"
        # Another pin replaces it; unpinning a run that is not the baseline is a conflict.
        assert client.put("/runs/other/baseline", headers=as_member).status_code == 200
        assert client.delete("/runs/base/baseline", headers=as_member).status_code == 409
        assert client.delete("/runs/other/baseline", headers=as_member).status_code == 204
        # A later read (a new page: the list as another team's member first, then ours).
        fresh = client.get("/runs?limit=3&baseline=true", headers=as_member).json()["items"]
        assert all(r["baseline"] is None for r in fresh if r["id"] != "base")
    db = Database(db_url)
    try:
        with db.read() as s:
            actions = list(
                s.scalars(
                    select(AuditEntry.action)
                    .where(AuditEntry.action.like("run.baseline%"))
                    .order_by(AuditEntry.id)
                )
            )
    finally:
        db.dispose()
    assert actions == ["run.baseline_pin", "run.baseline_pin", "run.baseline_unpin"]


def test_a_pin_and_an_unpin_are_seen_at_once_by_reads_kept_before_them(db_url: str) -> None:
    with auth_on(db_url, ("m", "vision", "member")) as (client, [(_, member)]):
        _runs(db_url)
        as_member = {"Authorization": f"Bearer {member}"}

        def compared() -> tuple[object, object]:
            run = client.get("/runs/other?baseline=true", headers=as_member).json()
            page = client.get("/runs?baseline=true", headers=as_member).json()["items"]
            return run["baseline"], next(r["baseline"] for r in page if r["id"] == "other")

        assert compared() == (None, None)  # both answers now kept
        client.put("/runs/base/baseline", headers=as_member).raise_for_status()
        run, listed = compared()
        assert run is not None and listed == run and run["run_id"] == "base"
        client.delete("/runs/base/baseline", headers=as_member).raise_for_status()
        assert compared() == (None, None)
