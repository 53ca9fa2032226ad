"""Secrets by reference: resolved from the service's store at submit time, absent from every
answer, the script export and the run's stored rows; env values that look like keys are masked."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import re
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, select, text

from jobs.grant import GRANT_ENV, GRANT_URL_ENV, HOLDER_NAMESPACE, WORKER_HOOK, holder_name
from service.app import create_app
from service.cluster.ray_jobs import RayRejected
from service.errors import InvalidSpec
from service.loops.submitter import CLUSTER_EVENTS_OFF, Submitter
from service.recipes import env_names
from service.recipes.base import Launch, LaunchContext
from service.recipes.registry import RecipeRegistry
from service.scheduling.admission import QueuedRun
from service.scheduling.backlog import QueuedRow
from service.scheduling.shape import ResourceShape
from service.store import grants
from service.store.db import Database
from service.store.models import Run, SecretGrant
from service.store.status import RunStatus
from service.team_secrets import (
    MASK,
    SecretMissing,
    SecretStore,
    looks_secret,
    missing_message,
    namespace,
    team_var,
)
from tests.conftest import make_settings
from tests.factories import add_run
from tests.recipes import ScriptRecipe

WANDB = "wandb-secret-value-0123456789"
HF = "hf_abcdefghijklmnopqrstuvwxyz012345"


def test_the_store_prefers_the_teams_own_secret_then_the_shared_one(tmp_path: Path) -> None:
    (tmp_path / "teams" / "vision").mkdir(parents=True)
    (tmp_path / "teams" / "vision" / "wandb-key").write_text("team-value\n")
    (tmp_path / "shared").mkdir()
    (tmp_path / "shared" / "wandb-key").write_text("shared-value")
    env = {"RLRUN_SECRET_SPEECH__HF_TOKEN": "speech-hf", "RLRUN_SHARED_SECRET_HF_TOKEN": "hf-sh"}
    store = SecretStore(str(tmp_path), env)
    assert store.get("vision", "wandb-key") == "team-value"
    assert store.get("speech", "wandb-key") == "shared-value"
    assert store.get("speech", "hf-token") == "speech-hf"
    assert store.get("vision", "hf.token") == "hf-sh"
    refs = {"A": "wandb-key", "B": "hf-token", "C": "nope"}
    assert store.unknown("speech", refs) == ["C"]
    with pytest.raises(SecretMissing, match="'nope'") as info:
        store.resolve("vision", {"WANDB_API_KEY": "wandb-key", "X": "nope"})
    assert "team-value" not in str(info.value)


def test_the_old_unscoped_layout_is_not_read(tmp_path: Path) -> None:
    """Files beside the namespaces and env vars without one belong to no team."""
    (tmp_path / "vision").mkdir()
    (tmp_path / "vision" / "wandb-key").write_text("v")
    (tmp_path / "wandb-key").write_text("v")
    store = SecretStore(str(tmp_path), {"RLRUN_SECRET_WANDB_KEY": "v"})
    assert store.get("vision", "wandb-key") is None


NLP_SECRETS = {
    "RLRUN_SECRET_NLP__DB_PASSWORD": "nlp-db-password",
    "RLRUN_SECRET_ML_UOPS__DB_PASSWORD": "ml_ops-db-password",
    # Spelled with the separator in the name part: no name resolves to it.
    "RLRUN_SECRET_VISION__NLP__DB_PASSWORD": "nlp-db-password",
}


def _nlp_files(root: Path) -> Path:
    for own in ("teams/vision", "teams/ml-ops", "teams/ml", "shared"):  # a ".." climbs from these
        (root / own).mkdir(parents=True)
    for team in ("nlp", "ml_ops"):
        (root / "teams" / team).mkdir(parents=True)
        (root / "teams" / team / "db_password").write_text(f"{team}-db-password")
        (root / "teams" / team / "x").write_text(f"{team}-x")
    return root


# (team asking, a name that spells another team's secret)
NAME_TRICKS = [
    ("vision", "nlp__db_password"),
    ("vision", "NLP__DB_PASSWORD"),
    ("vision", "Nlp__Db.Password"),
    ("vision", "nlp-_db_password"),  # "-" and "_" spell "__" too
    ("vision", "nlp.-db-password"),
    ("vision", "../nlp/x"),
    ("vision", "../teams/nlp/x"),
    ("vision", "teams/nlp/x"),
    ("vision", "..%2fnlp%2fx"),
    ("vision", "ml_uops__db_password"),
    ("ml-ops", "db_password"),  # ml-ops is not ml_ops
    ("ml", "uops__db_password"),
    ("ml", "_uops__db_password"),
]


@pytest.mark.parametrize(("team", "name"), NAME_TRICKS)
def test_no_name_reaches_another_teams_secret(tmp_path: Path, team: str, name: str) -> None:
    store = SecretStore(str(_nlp_files(tmp_path)), NLP_SECRETS)
    assert store.get(team, name) is None
    assert store.unknown(team, {"X": name}) == ["X"]
    with pytest.raises(SecretMissing) as info:
        store.resolve(team, {"X": name})
    assert str(info.value) == missing_message(name)


def test_a_service_secret_such_as_a_cluster_token_is_no_run_s_to_name(tmp_path: Path) -> None:
    (tmp_path / "service").mkdir()
    (tmp_path / "service" / "ray-b").write_text("cluster-b-token")
    env = {"RLRUN_SERVICE_SECRET_RAY_A": "cluster-a-token"}
    store = SecretStore(str(tmp_path), env)
    assert store.service_secret("ray-b") == "cluster-b-token"
    assert store.service_secret("ray-a") == "cluster-a-token"
    for name in ("ray-b", "ray-a", "service/ray-b", "../service/ray-b"):
        assert store.get("nlp", name) is None
        assert store.unknown("nlp", {"X": name}) == ["X"]
    assert store.service_secret("../shared/ray-b") is None


def test_team_namespaces_are_one_to_one_and_never_hold_the_separator() -> None:
    teams = ["ml-ops", "ml_ops", "mlops", "ml-_ops", "ml_-ops", "ml--ops", "ml__ops", "m-l", "m_l"]
    teams += ["a", "a-", "a_", "a-h", "a_h", "a_u", "a-u", "ah", "au", "h", "u", "0-0", "0_0"]
    spelled = {namespace(t) for t in teams}
    assert len(spelled) == len(teams)
    assert all("__" not in ns and not ns.endswith("_") for ns in spelled)
    assert (namespace("ml-ops"), namespace("ml_ops")) == ("ML_HOPS", "ML_UOPS")
    assert team_var("ml-ops", "wandb.key") == "RLRUN_SECRET_ML_HOPS__WANDB_KEY"
    with pytest.raises(ValueError):
        namespace("../nlp")


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
    monkeypatch.setenv("RLRUN_SECRET_DEFAULT__WANDB_TEAM_KEY", WANDB)
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
        ({"RAY_JOB_STOP_WAIT_TIME_S": "k"}, "secrets.RAY_JOB_STOP_WAIT_TIME_S"),
    ]:
        resp = api.post("/runs", json=base | {"secrets": secrets})
        assert resp.status_code == 422, secrets
        assert resp.json()["errors"][0]["field"] == field


def test_a_secret_the_service_does_not_hold_is_refused_at_accept(
    api: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RLRUN_SECRET_DEFAULT__WANDB_KEY", WANDB)
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


def _answers_for(client: TestClient, team: str, name: str) -> list[tuple[int, str]]:
    """Accept and dry run for a spec naming ``name``, with the name itself blanked out."""
    body = {"recipe": "test-script", "team": team, "secrets": {"X": name}}
    return [
        (r.status_code, r.text.replace(json.dumps(name)[1:-1], "NAME"))
        for r in (
            client.post("/runs", json=body),
            client.post("/runs", params={"dry_run": True}, json=body),
        )
    ]


def test_another_teams_secret_is_answered_exactly_like_a_missing_one(
    db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for var, value in NLP_SECRETS.items():
        monkeypatch.setenv(var, value)
    settings = make_settings(
        db_url, "http://127.0.0.1:9", run_loops=False, secrets_dir=str(_nlp_files(tmp_path))
    )
    with TestClient(create_app(settings)) as client:
        assert _answers_for(client, "nlp", "db_password")[1][0] == 200  # nlp's own: it exists
        missing = _answers_for(client, "vision", "no-such-secret")
        assert [code for code, _ in missing] == [422, 422]
        for team, name in NAME_TRICKS:
            assert _answers_for(client, team, name) == missing, (team, name)
        assert [r["team"] for r in client.get("/runs").json()["items"]] == ["nlp"]


@pytest.mark.parametrize(
    "value", ["${RLRUN_DATABASE_URL}", "$HOME", "x$RLRUN_RAY_TOKEN", "a${b}c", "$$HOME", "$1"]
)
def test_env_values_ray_would_expand_are_refused(api: TestClient, value: str) -> None:
    body = {
        "recipe": "verl-fully-async",
        "preset": "geo3k-qwen3vl-8b-npu",
        "runtime_env": {"env_vars": {"WANDB_PROJECT": "p", "X": value}},
    }
    for params in [{}, {"dry_run": True}]:
        resp = api.post("/runs", params=params, json=body)
        assert resp.status_code == 422, resp.text
        assert [e["field"] for e in resp.json()["errors"]] == ["runtime_env.env_vars.X"]
    assert api.get("/runs").json()["items"] == []


def test_env_values_with_a_plain_dollar_are_literal() -> None:
    assert all(env_names.value_refusal(v) is None for v in ["100$", "$", "a $ b", "$-1", "$/x"])


class _ComposesExpandable(ScriptRecipe):
    """A recipe (as a plugin could be) whose own composed env holds a value Ray would expand."""

    def build(self, spec: Any, ctx: LaunchContext) -> Launch:
        launch = super().build(spec, ctx)
        env = {**launch.runtime_env["env_vars"], "CACHE": "${HOME}/cache"}
        return dataclasses.replace(launch, runtime_env={"env_vars": env})


def test_a_composed_env_value_ray_would_expand_is_refused_too() -> None:
    registry = RecipeRegistry()
    registry.register(_ComposesExpandable())
    with pytest.raises(InvalidSpec) as info:
        registry.build({"recipe": "test-script"}, LaunchContext(run_id="r1"))
    assert [e["field"] for e in info.value.extra["errors"]] == ["runtime_env.env_vars.CACHE"]


def test_the_services_own_variables_are_not_settable_by_a_spec(api: TestClient) -> None:
    for var in ["RLRUN_GRANT", "RLRUN_GRANT_URL", "RLRUN_DATABASE_URL"]:
        resp = api.post("/runs", json={"recipe": "test-script", "secrets": {var: "k"}})
        assert resp.status_code == 422, var
        assert resp.json()["errors"][0]["field"] == f"secrets.{var}"
        body = {
            "recipe": "verl-fully-async",
            "preset": "geo3k-qwen3vl-8b-npu",
            "runtime_env": {"env_vars": {var: "http://attacker.example"}},
        }
        resp = api.post("/runs", params={"dry_run": True}, json=body)
        assert resp.status_code == 422, var
        assert resp.json()["errors"][0]["field"] == f"runtime_env.env_vars.{var}"


PACKAGE = "gcs://_ray_pkg_jobs.zip"


class FakeRay:
    """Records what would be sent to Ray; or refuses, quoting the runtime env as Ray may."""

    def __init__(self, refuse: bool = False) -> None:
        self.refuse = refuse
        self.sent: list[dict[str, Any]] = []

    def package_uri(self, path: Path) -> str:
        return PACKAGE

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
def test_a_run_naming_secrets_is_submitted_with_a_grant_never_their_values(
    db_url: str, refuse: bool
) -> None:
    from service.store.db import upgrade

    upgrade(db_url)
    db = Database(db_url)
    add_run(db, "r1", RunStatus.QUEUED)
    ray = FakeRay(refuse)
    store = SecretStore(None, {"RLRUN_SECRET_T__WANDB_KEY": WANDB})
    submitter = _submitter(db, ray, store)
    submitter.grant_url = "http://service.example:8000"
    submitter._submit(_claimed("r1", LAUNCH))
    with db.transaction() as s:
        row = s.get(Run, "r1")
        assert row is not None
        grant = s.scalars(select(SecretGrant)).one_or_none()
        stored = f"{row.launch} {row.ray_message} {[e.reason for e in row.events]}"
        status = row.status
    db.dispose()
    assert WANDB not in stored
    if refuse:
        # The run failed at submit: its grant went with it.
        assert status == RunStatus.FAILED and MASK in stored and grant is None
        return
    assert grant is not None
    assert (grant.run_id, grant.submission_id, grant.redeemed_at) == ("r1", "r1", None)
    stored += f" {grant.token_hash} {grant.submission_id}"
    sent = ray.sent[0]["runtime_env"]
    token = sent["env_vars"].pop(GRANT_ENV)
    assert sent["env_vars"] == {
        "A": "1",
        GRANT_URL_ENV: "http://service.example:8000",
        **CLUSTER_EVENTS_OFF,
    }
    assert sent["worker_process_setup_hook"] == WORKER_HOOK
    assert WANDB not in str(ray.sent)
    assert grants.digest(token) == grant.token_hash and token not in stored


def test_a_run_naming_no_secrets_gets_no_grant(db_url: str) -> None:
    from service.store.db import upgrade

    upgrade(db_url)
    db = Database(db_url)
    add_run(db, "r1", RunStatus.QUEUED)
    ray = FakeRay()
    _submitter(db, ray, SecretStore(None, {}))._submit(_claimed("r1", LAUNCH | {"secrets": {}}))
    with db.transaction() as s:
        assert s.scalars(select(SecretGrant)).all() == []
    db.dispose()
    env = {"A": "1", **CLUSTER_EVENTS_OFF}
    assert ray.sent[0]["runtime_env"] == {"env_vars": env, "py_modules": [PACKAGE]}


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


@contextlib.contextmanager
def _granting(
    tmp_path: Path, ray_cluster: Any, secret: str, value: str, **overrides: Any
) -> Iterator[Any]:
    """A service over HTTP on ``ray_cluster`` whose secrets dir holds ``value`` at ``secret``,
    at the public URL its jobs redeem their grants from (``overrides`` of its settings): an
    ``httpx.Client`` of it."""
    import httpx

    from tests.live import ServerThread, free_port

    (tmp_path / "secrets" / secret).parent.mkdir(parents=True)
    (tmp_path / "secrets" / secret).write_text(value)
    port = free_port()
    settings = make_settings(
        f"sqlite:///{tmp_path}/db.sqlite",
        ray_cluster.address,
        secrets_dir=str(tmp_path / "secrets"),
        public_url=f"http://127.0.0.1:{port}",
        **overrides,
    )
    with (
        ServerThread(create_app(settings), port=port) as url,
        httpx.Client(base_url=url, timeout=30) as client,
    ):
        yield client


def _digest(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()[:16]


@pytest.mark.ray
def test_a_secret_reaches_the_jobs_processes_and_never_rays_job_table(
    ray_cluster: Any, ray: Any, tmp_path: Path
) -> None:
    """Through a real Ray head and a real HTTP server: the job's driver, an actor and a task see
    the value; Ray's job list, job info and GCS job table, and the service's answers, do not;
    the grant Ray does hold is refused once used, and after the run ended."""
    import httpx

    from tests.conftest import TERMINAL, wait_for, wait_status

    body = {"recipe": "test-secret-probe", "secrets": {"WANDB_API_KEY": "wandb-key"}}
    with _granting(
        tmp_path,
        ray_cluster,
        "teams/default/wandb-key",
        WANDB + "\n",
        recipe_plugins="tests.recipes:register,tests.secret_probe:register",
    ) as client:
        resp = client.post("/runs", json=body)
        assert resp.status_code == 201, resp.text
        run_id = resp.json()["id"]
        run = wait_status(client, run_id, {"SUCCEEDED", "FAILED"}, timeout=120)
        logs = wait_for(
            lambda: client.get(f"/runs/{run_id}/logs").text,
            lambda text: re.search(r"^probe store holds it (True|False)$", text, re.M),
            timeout=60,
        )
        assert run["status"] == "SUCCEEDED", (run, logs)
        seen = _digest(WANDB)
        for who in ("driver", "actor", "task"):
            assert f"probe {who} {seen}" in logs, logs
        assert "probe job table holds it False" in logs, logs
        answers = [
            client.get(p).text for p in (f"/runs/{run_id}", "/runs", f"/runs/{run_id}/script")
        ]
        answers.append(logs)
        ray_says = [
            httpx.get(
                f"{ray_cluster.address}{path}", headers=ray_cluster.auth_headers, timeout=30
            ).text
            for path in ("/api/jobs/", f"/api/jobs/{run_id}", "/api/v0/jobs")
        ]
        assert all(WANDB not in text for text in answers + ray_says)
        # What Ray does hold is the grant: redeemed, and its run over, it answers nothing.
        job = httpx.get(
            f"{ray_cluster.address}/api/jobs/{run_id}", headers=ray_cluster.auth_headers, timeout=30
        ).json()
        token = job["runtime_env"]["env_vars"][GRANT_ENV]
        again = client.post("/grants/redeem", headers={"Authorization": f"Bearer {token}"})
        assert again.status_code == 401 and WANDB not in again.text
    # While the job ran, its workers read the values from Ray's store; they went with the job.
    assert "probe store holds it True" in logs, logs
    key = holder_name(token)
    gone = STORE_GONE.format(key=key, namespace=HOLDER_NAMESPACE)
    ray.submit(f"{run_id}-after", shlex.join(["python3", "-c", gone]), {}, {})
    after = wait_for(lambda: ray.get(f"{run_id}-after"), lambda j: j.status in TERMINAL, 120)
    assert after.status == "SUCCEEDED", ray.logs(f"{run_id}-after")


# Run as a Ray job: succeeds once the store no longer holds the key (within 30 s).
STORE_GONE = """
import time, ray
from ray.experimental.internal_kv import _internal_kv_get
ray.init()
deadline = time.time() + 30
while _internal_kv_get("{key}", namespace="{namespace}") is not None:
    assert time.time() < deadline, "still in the store"
    time.sleep(0.5)
"""


@pytest.mark.ray
def test_tiny_grpo_redeems_its_grant_once_and_trains(
    ray_cluster: Any, ray: Any, tmp_path: Path
) -> None:
    """The real launcher path: tiny-grpo's entrypoint redeems the grant before it starts Ray."""
    import httpx

    from tests.conftest import wait_status

    body = {
        "recipe": "tiny-grpo",
        "total_rollout_steps": 16,
        "batch_prompts": 8,
        "gen_seconds": 0,
        "train_seconds": 0,
        "secrets": {"WANDB_API_KEY": "wandb-key"},
    }
    with _granting(tmp_path, ray_cluster, "shared/wandb-key", WANDB) as client:
        run_id = client.post("/runs", json=body).json()["id"]
        run = wait_status(client, run_id, {"SUCCEEDED", "FAILED"}, timeout=180)
        assert run["status"] == "SUCCEEDED", client.get(f"/runs/{run_id}/logs").text
        audited = client.get("/audit", params={"run_id": run_id}).json()["items"]
        assert [e["action"] for e in audited if e["action"].startswith("grant")] == ["grant.redeem"]
        job = httpx.get(
            f"{ray_cluster.address}/api/jobs/{run_id}", headers=ray_cluster.auth_headers, timeout=30
        ).text
        assert WANDB not in job and WANDB not in client.get(f"/runs/{run_id}/logs").text
