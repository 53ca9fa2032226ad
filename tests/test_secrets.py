"""Secrets by reference: resolved from the service's store at submit time, absent from every
answer, the script export and the run's stored rows; env values that look like keys are masked."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, text

from service.cluster.ray_jobs import RayRejected
from service.loops.submitter import Submitter
from service.recipes.base import ResourceShape
from service.scheduling.admission import QueuedRun
from service.scheduling.backlog import QueuedRow
from service.secrets import MASK, SecretMissing, SecretStore, looks_secret
from service.store.db import Database
from service.store.models import Run
from service.store.status import RunStatus
from tests.factories import add_run

WANDB = "wandb-secret-value-0123456789"
HF = "hf_abcdefghijklmnopqrstuvwxyz012345"


def test_the_store_prefers_the_teams_own_secret_then_the_shared_one(tmp_path: Path) -> None:
    (tmp_path / "vision").mkdir()
    (tmp_path / "vision" / "wandb-key").write_text("team-value\n")
    (tmp_path / "wandb-key").write_text("shared-value")
    env = {"RLRUN_SECRET_SPEECH__HF_TOKEN": "speech-hf", "RLRUN_SECRET_HF_TOKEN": "shared-hf"}
    store = SecretStore(str(tmp_path), env)
    assert store.get("vision", "wandb-key") == "team-value"
    assert store.get("speech", "wandb-key") == "shared-value"
    assert store.get("speech", "hf-token") == "speech-hf"
    assert store.get("vision", "hf.token") == "shared-hf"
    assert store.get("vision", "../vision/wandb-key") is None
    refs = {"A": "wandb-key", "B": "hf-token", "C": "nope", "D": "../vision/wandb-key"}
    assert store.unknown("speech", refs) == ["C", "D"]
    with pytest.raises(SecretMissing, match="'nope'") as info:
        store.resolve("vision", {"WANDB_API_KEY": "wandb-key", "X": "nope"})
    assert "team-value" not in str(info.value)


def test_env_values_that_look_like_keys_are_masked() -> None:
    assert looks_secret("WANDB_API_KEY", "x") and looks_secret("MY_PASSWORD", "short")
    assert looks_secret("ANYTHING", HF) and looks_secret("X", "A1" * 20)
    assert not looks_secret("WANDB_PROJECT", "my-project")
    assert not looks_secret("VLLM_USE_V1", "1")
    assert not looks_secret("MODEL", "/mnt/models/Qwen3-VL-8B-Instruct-abcdefgh")
    assert not looks_secret("NAME", "a-long-but-plain-setting-value-here")


def test_secret_values_appear_in_no_answer_and_no_script(
    api: TestClient, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RLRUN_SECRET_WANDB_TEAM_KEY", WANDB)
    body = {
        "recipe": "verl-fully-async",
        "preset": "geo3k-qwen3vl-8b-npu",
        "secrets": {"WANDB_API_KEY": "wandb-team-key"},
        "runtime_env": {"env_vars": {"HF_TOKEN": HF, "WANDB_PROJECT": "visible"}},
    }
    dry = api.post("/runs", params={"dry_run": True}, json=body)
    assert dry.status_code == 200, dry.text
    run = api.post("/runs", json=body)
    assert run.status_code == 201, run.text
    run_id = run.json()["id"]
    answers = [
        dry.text,
        run.text,
        api.get(f"/runs/{run_id}").text,
        api.get("/runs").text,
        api.get(f"/runs/{run_id}/script").text,
    ]
    for answer in answers:
        assert HF not in answer and WANDB not in answer
    got = api.get(f"/runs/{run_id}").json()
    assert got["runtime_env"]["env_vars"]["HF_TOKEN"] == MASK
    assert got["spec"]["runtime_env"]["env_vars"]["HF_TOKEN"] == MASK
    assert got["runtime_env"]["env_vars"]["WANDB_PROJECT"] == "visible"
    assert got["spec"]["secrets"] == {"WANDB_API_KEY": "wandb-team-key"}
    assert not any("need credentials" in w for w in got["warnings"])
    script = api.get(f"/runs/{run_id}/script").text
    assert ': "${WANDB_API_KEY:?' in script and ': "${HF_TOKEN:?' in script
    assert '"$RUNTIME_ENV" "$FILES" HF_TOKEN WANDB_API_KEY)"' in script
    # Nothing of a secret's value is stored: it does not exist until submit time.
    engine = create_engine(db_url)
    with engine.connect() as conn:
        launch = conn.execute(text("SELECT launch FROM runs")).scalar_one()
    engine.dispose()
    assert "wandb-team-key" in str(launch) and WANDB not in str(launch)


def test_secret_refs_follow_the_env_name_rules(api: TestClient) -> None:
    base = {"recipe": "test-script"}
    for secrets, field in [
        ({"LD_PRELOAD": "k"}, "secrets.LD_PRELOAD"),
        ({"PATH\n": "k"}, "secrets.PATH\n"),  # a line break: refused before the name rules
        ({"KEY": "../etc/passwd"}, "secrets"),
        ({"RAY_JOB_STOP_WAIT_TIME_S": "k"}, "secrets.RAY_JOB_STOP_WAIT_TIME_S"),
    ]:
        resp = api.post("/runs", json=base | {"secrets": secrets})
        assert resp.status_code == 422, secrets
        assert resp.json()["errors"][0]["field"] == field


def test_a_secret_the_service_does_not_hold_is_refused_at_accept(
    api: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RLRUN_SECRET_WANDB_KEY", WANDB)
    unknown = {"recipe": "test-script", "secrets": {"WANDB_API_KEY": "wandb-key", "HF": "nope"}}
    answers = []
    for params in [{}, {"dry_run": True}]:
        resp = api.post("/runs", params=params, json=unknown)
        assert resp.status_code == 422, resp.text
        assert resp.headers["content-type"] == "application/problem+json"
        assert resp.json()["errors"] == [
            {
                "loc": ["secrets", "HF"],
                "field": "secrets.HF",
                "msg": "secret 'nope' is not in the service's store",
                "type": "unknown_secret",
            }
        ]
        answers.append(resp.text)
    assert api.get("/runs").json()["items"] == []
    known = {"recipe": "test-script", "secrets": {"WANDB_API_KEY": "wandb-key"}}
    dry = api.post("/runs", params={"dry_run": True}, json=known)
    run = api.post("/runs", json=known)
    assert (dry.status_code, run.status_code) == (200, 201), run.text
    run_id = run.json()["id"]
    answers += [dry.text, run.text, api.get(f"/runs/{run_id}").text, api.get("/runs").text]
    answers.append(api.get(f"/runs/{run_id}/script").text)
    assert all(WANDB not in answer for answer in answers)


class FakeRay:
    """Records what would be sent to Ray; or refuses, quoting the runtime env as Ray may."""

    def __init__(self, refuse: bool = False) -> None:
        self.refuse = refuse
        self.sent: list[dict[str, Any]] = []

    def package_uri(self, path: Path) -> str:
        return "gcs://_ray_pkg_jobs.zip"

    def submit(self, **kw: Any) -> bool:
        if self.refuse:
            raise RayRejected(f"bad runtime_env: {kw['runtime_env']}")
        self.sent.append(kw)
        return True


def _claimed(run_id: str, launch: dict[str, Any]) -> QueuedRow:
    return QueuedRow(QueuedRun(run_id, "t", 1, ResourceShape()), run_id, launch, None)


def _submitter(db: Database, ray: FakeRay, store: SecretStore) -> Submitter:
    return Submitter(db, ray, None, None, "me", 60.0, 4, store)  # type: ignore[arg-type]


LAUNCH = {
    "argv": ["true"],
    "entrypoint": "true",
    "runtime_env": {"env_vars": {"A": "1"}},
    "secrets": {"WANDB_API_KEY": "wandb-key"},
}


@pytest.mark.parametrize("refuse", [False, True])
def test_secrets_are_resolved_at_submit_time_and_kept_out_of_the_rows(
    db_url: str, refuse: bool
) -> None:
    from service.store.db import upgrade

    upgrade(db_url)
    db = Database(db_url)
    add_run(db, "r1", RunStatus.QUEUED)
    ray = FakeRay(refuse)
    store = SecretStore(None, {"RLRUN_SECRET_WANDB_KEY": WANDB})
    _submitter(db, ray, store)._submit(_claimed("r1", LAUNCH))
    with db.transaction() as s:
        row = s.get(Run, "r1")
        assert row is not None
        stored = f"{row.launch} {row.ray_message} {[e.reason for e in row.events]}"
        status = row.status
    db.dispose()
    assert WANDB not in stored
    if refuse:
        assert status == RunStatus.FAILED and MASK in stored
    else:
        assert ray.sent[0]["runtime_env"]["env_vars"] == {"A": "1", "WANDB_API_KEY": WANDB}


def test_a_secret_missing_at_submit_time_fails_the_run_naming_it(db_url: str) -> None:
    from service.store.db import upgrade

    upgrade(db_url)
    db = Database(db_url)
    add_run(db, "r1", RunStatus.QUEUED)
    ray = FakeRay()
    _submitter(db, ray, SecretStore(None, {}))._submit(_claimed("r1", LAUNCH))
    with db.transaction() as s:
        row = s.get(Run, "r1")
        assert row is not None and row.status == RunStatus.FAILED
        assert "'wandb-key'" in (row.ray_message or "")
    db.dispose()
    assert ray.sent == []


@pytest.mark.ray
def test_a_secret_reaches_the_job_on_ray_and_no_answer(
    service_factory: Any, ray_cluster: Any, tmp_path: Path
) -> None:
    """Through a real Ray head: Ray's own record of the job has the value, the service's none."""
    import httpx

    from tests.conftest import wait_status

    (tmp_path / "secrets" / "default").mkdir(parents=True)
    (tmp_path / "secrets" / "default" / "wandb-key").write_text(WANDB + "\n")
    db = f"sqlite:///{tmp_path}/db.sqlite"
    with service_factory(db, secrets_dir=str(tmp_path / "secrets")) as client:
        body = {"recipe": "test-script", "secrets": {"WANDB_API_KEY": "wandb-key"}}
        run_id = client.post("/runs", json=body).json()["id"]
        run = wait_status(client, run_id, {"SUCCEEDED", "FAILED"})
        assert run["status"] == "SUCCEEDED", run
        answers = [client.get(f"/runs/{run_id}").text, client.get(f"/runs/{run_id}/script").text]
    job = httpx.get(
        f"{ray_cluster.address}/api/jobs/{run_id}", headers=ray_cluster.auth_headers, timeout=10
    ).json()
    assert job["runtime_env"]["env_vars"]["WANDB_API_KEY"] == WANDB
    assert all(WANDB not in answer for answer in answers)
