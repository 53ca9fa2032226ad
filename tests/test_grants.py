"""Secrets grants: a run's job redeems its one-time grant for the values once; a second use, an
expired grant, one whose run is over, or anything else answers the same 401, and is audited."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from jobs import grant as job_grant
from jobs.verl_launch import EXIT_FAILED
from jobs.verl_launch import __main__ as verl_launch
from service.app import create_app
from service.recipes.base import Launch
from service.scheduling.shape import ResourceShape
from service.store import audit, grants
from service.store.db import Database
from service.store.lifecycle import transition
from service.store.models import Run, RunEvent, SecretGrant, WebhookDelivery
from service.store.status import RunStatus
from tests.conftest import make_settings
from tests.factories import add_run, add_webhook, sqlite_with_tokens
from tests.live import ServerThread, status_from

WANDB = "wandb-secret-value-0123456789"
SECRETS = {"WANDB_API_KEY": "wandb-key"}


@pytest.fixture
def secrets_dir(tmp_path: Path) -> str:
    (tmp_path / "teams" / "t").mkdir(parents=True)
    (tmp_path / "teams" / "t" / "wandb-key").write_text(WANDB + "\n")
    return str(tmp_path)


@pytest.fixture
def client(db: Database, db_url: str, secrets_dir: str) -> Iterator[TestClient]:
    settings = make_settings(db_url, "http://127.0.0.1:9", run_loops=False, secrets_dir=secrets_dir)
    with TestClient(create_app(settings)) as c:
        yield c


def _granted(
    db: Database,
    status: RunStatus = RunStatus.RUNNING,
    ttl_s: float = 60.0,
    refs: dict[str, str] = SECRETS,
) -> str:
    launch = Launch(argv=["true"], runtime_env={}, shape=ResourceShape(), secrets=refs)
    add_run(db, "r1", status, launch=launch.as_dict())
    with db.transaction() as session:
        return grants.issue(session, "r1", "r1", ttl_s)


def _redeem(client: TestClient, token: str | None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    return client.post("/grants/redeem", headers=headers)


def _audited(db: Database) -> list[tuple[str, str | None, str | None]]:
    with db.read() as session:
        return [(e.action, e.run_id, e.target) for e in reversed(audit.page(session, 50))]


def _refusal(resp: httpx.Response) -> tuple[int, str, str]:
    return resp.status_code, resp.headers["content-type"], resp.text


def test_a_grant_answers_its_runs_values_once(client: TestClient, db: Database) -> None:
    token = _granted(db)
    first = _redeem(client, token)
    assert first.status_code == 200, first.text
    assert first.json() == {"env": {"WANDB_API_KEY": WANDB}, "submission_id": "r1"}
    assert first.headers["cache-control"] == "no-store"
    again = _redeem(client, token)
    unknown = _redeem(client, grants.PREFIX + "x" * 43)
    assert _refusal(again)[0] == 401
    assert _refusal(again) == _refusal(unknown) == _refusal(_redeem(client, None))
    assert WANDB not in again.text
    assert _audited(db) == [
        ("grant.redeem", "r1", None),
        ("grant.refused", "r1", "grant already redeemed; refusals=1"),
    ]  # tokens the service never issued leave no row: guesses cannot fill the trail


def test_an_expired_grant_answers_nothing(client: TestClient, db: Database) -> None:
    token = _granted(db, ttl_s=0.05)
    time.sleep(0.3)
    resp = _redeem(client, token)
    assert _refusal(resp) == _refusal(_redeem(client, "rlgrant_unknown"))
    assert _audited(db)[0] == ("grant.refused", "r1", "grant expired; refusals=1")
    assert _redeem(client, token).status_code == 401  # not redeemed by the refusal either


@pytest.mark.parametrize("status", [RunStatus.FAILED, RunStatus.SUCCEEDED, RunStatus.CANCELLED])
def test_a_grant_whose_run_is_over_answers_nothing(
    client: TestClient, db: Database, status: RunStatus
) -> None:
    resp = _redeem(client, _granted(db, status))
    assert _refusal(resp) == _refusal(_redeem(client, "rlgrant_unknown"))
    assert _audited(db)[0] == ("grant.refused", "r1", "the run is over; refusals=1")


def test_a_flood_of_refused_redemptions_leaves_one_row_a_minute(
    client: TestClient, db: Database
) -> None:
    token = _granted(db)
    assert _redeem(client, token).status_code == 200
    for _ in range(200):
        assert _redeem(client, token).status_code == 401
    assert _audited(db) == [
        ("grant.redeem", "r1", None),
        ("grant.refused", "r1", "grant already redeemed; refusals=1"),
    ]
    services = client.app.state.services  # type: ignore[attr-defined]
    services.grant_refusals.window_s = 0.0  # the minute is over: the next row counts the rest
    _redeem(client, token)
    assert _audited(db)[-1] == ("grant.refused", "r1", "grant already redeemed; refusals=200")


def test_replays_from_500_loopback_addresses_fold_into_one_row(
    tmp_path: Path, secrets_dir: str
) -> None:
    # A job picks any source address of 127/8: the refusals fold per grant, not per address.
    # (On SQLite only: the folding is the same on both, and 500 connections cost seconds.)
    db_url, _ = sqlite_with_tokens(tmp_path, "grants.sqlite")
    db = Database(db_url)
    token = _granted(db)
    settings = make_settings(db_url, "http://127.0.0.1:9", run_loops=False, secrets_dir=secrets_dir)
    headers = {"Authorization": f"Bearer {token}"}
    with ServerThread(create_app(settings)) as url:
        assert httpx.post(f"{url}/grants/redeem", headers=headers).status_code == 200
        for i in range(500):
            address = f"127.{1 + i // 250}.{i % 250}.{1 + i % 7}"
            assert status_from(address, url, "POST", "/grants/redeem", token) == 401
    assert _audited(db) == [
        ("grant.redeem", "r1", None),
        ("grant.refused", "r1", "grant already redeemed; refusals=1"),
    ]
    with db.read() as session:
        events = [e.reason for e in session.scalars(select(RunEvent)).all()]
    assert sum("presented again" in reason for reason in events) == 1
    db.dispose()


def test_a_replayed_grant_is_an_event_of_its_run_and_a_webhook_message(
    client: TestClient, db: Database
) -> None:
    token = _granted(db)
    add_webhook(
        db,
        ["run.grant_replayed"],
        url="https://hooks.example/x",
        created_by="ops",
        secret="whsec_x",
    )
    assert _redeem(client, token).status_code == 200
    for _ in range(3):  # told once, as the refusals are audited: once a minute per grant
        assert _redeem(client, token).status_code == 401
    with db.read() as session:
        sent = session.scalars(select(WebhookDelivery)).all()
        events = [e.reason for e in session.scalars(select(RunEvent)).all()]
    assert [(d.event_type, d.payload["run"]["id"]) for d in sent] == [("run.grant_replayed", "r1")]
    assert sum("presented again" in reason for reason in events) == 1
    assert WANDB not in str([d.payload for d in sent])


def test_a_run_s_grants_are_purged_when_it_ends(db: Database) -> None:
    _granted(db)
    with db.transaction() as session:
        run = session.get(Run, "r1")
        assert run is not None
        transition(session, run, RunStatus.FAILED, "test")
    with db.read() as session:
        assert session.scalars(select(SecretGrant)).all() == []


def test_a_secret_gone_since_submit_is_named_not_answered(client: TestClient, db: Database) -> None:
    resp = _redeem(client, _granted(db, refs=SECRETS | {"HF_TOKEN": "gone"}))
    assert resp.status_code == 409
    assert "'gone'" in resp.text and WANDB not in resp.text
    assert _audited(db) == [("grant.redeem", "r1", "secret 'gone' is not in the service's store")]


def test_the_job_side_redeems_once_over_http(db: Database, db_url: str, secrets_dir: str) -> None:
    token = _granted(db)
    settings = make_settings(db_url, "http://127.0.0.1:9", run_loops=False, secrets_dir=secrets_dir)
    with ServerThread(create_app(settings)) as url:
        env = {job_grant.GRANT_ENV: token, job_grant.GRANT_URL_ENV: url + "/"}
        assert job_grant.redeem(env, timeout_s=30) == ({"WANDB_API_KEY": WANDB}, "r1")
        assert env[job_grant.GRANT_ENV] == token and env["WANDB_API_KEY"] == WANDB
        assert job_grant.GRANT_URL_ENV not in env  # nothing the job's own code needs
        env = {job_grant.GRANT_ENV: token, job_grant.GRANT_URL_ENV: url}
        with pytest.raises(job_grant.GrantRefused, match="HTTP 401") as info:
            job_grant.redeem(env, timeout_s=30)
        assert token not in str(info.value)
    assert job_grant.redeem({}) == ({}, None)
    with pytest.raises(job_grant.GrantRefused, match="not an http"):
        job_grant.redeem({job_grant.GRANT_ENV: token, job_grant.GRANT_URL_ENV: "file:///etc"})


def test_an_unreachable_service_fails_after_bounded_attempts() -> None:
    env = {job_grant.GRANT_ENV: "rlgrant_x", job_grant.GRANT_URL_ENV: "http://127.0.0.1:9"}
    started = time.monotonic()
    with pytest.raises(job_grant.GrantRefused, match="could not be redeemed"):
        job_grant.redeem(env, timeout_s=2, attempts=2)
    assert time.monotonic() - started < 30


def test_the_verl_launcher_stops_before_its_checks_when_the_grant_is_refused(
    db: Database, db_url: str, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    def no_preflight(*_: Any) -> Any:
        raise AssertionError("the preflight ran")

    monkeypatch.setattr(verl_launch, "preflight", no_preflight)
    settings = make_settings(db_url, "http://127.0.0.1:9", run_loops=False)
    with ServerThread(create_app(settings)) as url:
        monkeypatch.setenv(job_grant.GRANT_ENV, "rlgrant_not-issued")
        monkeypatch.setenv(job_grant.GRANT_URL_ENV, url)
        with pytest.raises(SystemExit) as info:
            verl_launch.main(["--plan", "{}", "--", "true"])
    assert info.value.code == EXIT_FAILED
    assert "refused the secrets grant (HTTP 401)" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("host", "public_url", "expected"),
    [
        ("127.0.0.1", None, "http://127.0.0.1:8123"),
        ("0.0.0.0", None, "http://127.0.0.1:8123"),  # a wildcard host: loopback
        ("::1", None, "http://[::1]:8123"),
        ("10.0.0.5", "https://rlrun.example/ ", "https://rlrun.example"),
    ],
)
def test_jobs_redeem_at_the_public_url_or_where_the_service_listens(
    host: str, public_url: str | None, expected: str
) -> None:
    assert (
        make_settings(
            "sqlite://", "local", listen_host=host, listen_port=8123, public_url=public_url
        ).service_url
        == expected
    )


@pytest.mark.parametrize(
    "url", ["ftp://x", "file:///etc/passwd", "http://", "http://h/$HOME", "http://h/?a=1", "h:80"]
)
def test_a_public_url_must_be_a_plain_http_url(url: str) -> None:
    with pytest.raises(ValueError, match="public_url"):
        make_settings("sqlite://", "local", public_url=url)
