"""The embedded Ray starts clean and closed: a job inherits none of the service's environment,
every process of the cluster listens on loopback only, and Ray's API wants the token."""

from __future__ import annotations

import json
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from service.app import create_app
from service.cluster.local_ray import INHERITED_ENV, LocalRayCluster, _is_free
from tests.conftest import RAY_PORT, make_settings, submit, wait_for, wait_status
from tests.listeners import listeners, session_members

DB_URL_MARK = "rlrun-clean-db"
SECRET = "s3cret-of-team-nlp-0123456789"
RAY_ENV = {
    "RAY_DEDUP_LOGS",
    "AUTOSCALER_UPDATE_INTERVAL_S",
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER",
    "RAY_AUTH_MODE",
    "RAY_AUTH_TOKEN_PATH",
}


def _poison(monkeypatch: pytest.MonkeyPatch) -> None:
    """The service's own environment, as a deployment would have it."""
    monkeypatch.setenv("RLRUN_SECRET_NLP__DB_PASSWORD", SECRET)
    monkeypatch.setenv("RLRUN_RAY_TOKEN", "rlrun-ray-token-of-another-cluster")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    monkeypatch.setenv("PGPASSWORD", SECRET)
    monkeypatch.setenv("PYTHONPATH", "/nowhere")


def test_a_nodes_environment_is_the_allow_list_and_ray_settings_only(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _poison(monkeypatch)
    monkeypatch.setenv("RLRUN_DATABASE_URL", f"postgresql://u:{SECRET}@db/{DB_URL_MARK}")
    cluster = LocalRayCluster([1], base_dir=tmp_path / "ray", state_dir=tmp_path / "state")
    env = cluster.node_env()
    assert set(env) <= set(INHERITED_ENV) | RAY_ENV, sorted(env)
    assert SECRET not in json.dumps(env) and cluster.token not in json.dumps(env)
    assert env["RAY_AUTH_MODE"] == "token"
    assert env["RAY_AUTH_TOKEN_PATH"] == str(cluster.token_path)
    assert cluster.token_path.parent == tmp_path / "state"
    assert LocalRayCluster([1]).token != cluster.token  # one token per handle
    cluster._write_token()
    assert stat.S_IMODE(cluster.token_path.stat().st_mode) == 0o600
    assert cluster.token_path.read_text() == cluster.token
    cluster.stop()
    assert not cluster.token_path.exists()


@dataclass
class Embedded:
    client: TestClient
    settings: Any
    state: Path


def _free_ports() -> int:
    """A base port near this session's own whose block is free now (another process's
    outgoing connections may hold a port of the first a while)."""
    for base in range(RAY_PORT + 300, RAY_PORT + 1000, 100):
        if all(_is_free(base + o) for o in (0, 1, 10, 11, 2000)):
            return base
    pytest.fail("no free block of ports for the embedded cluster")


@pytest.fixture(scope="module")
def embedded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Embedded]:
    """The service as `rlrun serve` runs it by default: its own local Ray (two nodes), started
    from an environment holding the service's credentials."""
    tmp = tmp_path_factory.mktemp("clean")
    with pytest.MonkeyPatch.context() as monkeypatch:
        _poison(monkeypatch)
        db_url = f"sqlite:///{tmp}/{DB_URL_MARK}.db"
        monkeypatch.setenv("RLRUN_DATABASE_URL", db_url)
        port = _free_ports()
        settings = make_settings(
            db_url,
            "local",
            local_npus="1,1",
            local_cpus_per_node=2,
            local_ray_port=port,
            local_dashboard_port=port + 2000,
            local_ray_state_dir=str(tmp / "state"),
        )
        with TestClient(create_app(settings)) as client:
            yield Embedded(client, settings, tmp / "state")


def _token_file(state: Path) -> Path:
    files = list(state.glob("local-ray-*.token"))
    if not files:  # the nodes run as the job user (the service as root): the token is theirs
        (record,) = state.glob("local-ray-*.json")
        files = [Path(json.loads(record.read_text())["base_dir"]) / "ray-token"]
    assert len(files) == 1 and files[0].exists(), files
    return files[0]


def _cluster_pids(state: Path) -> set[int]:
    (record,) = state.glob("local-ray-*.json")
    return session_members({int(g) for g in json.loads(record.read_text())["pgids"]})


@pytest.mark.ray
@pytest.mark.slow
def test_a_job_finds_no_credential_of_the_service_in_its_environment(embedded: Embedded) -> None:
    token_file = _token_file(embedded.state)
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
    token = token_file.read_text()
    # The job connects to the cluster (ray.init, a placement group): the token reaches it as a
    # file path only.
    run_id = submit(embedded.client, show_env=True, groups=[{"accelerators": 1, "cpus": 0}])
    run = wait_status(embedded.client, run_id, {"SUCCEEDED", "FAILED"}, timeout=120)
    assert run["status"] == "SUCCEEDED", run
    logs = wait_for_log(embedded.client, run_id, "ENV ")
    (line,) = [x for x in logs.splitlines() if x.startswith("ENV ")]
    env: dict[str, str] = json.loads(line.removeprefix("ENV "))
    text = json.dumps(env)
    assert not [k for k in env if k.startswith("RLRUN_")], sorted(env)
    assert DB_URL_MARK not in text and SECRET not in text and token not in text
    assert "RAY_AUTH_TOKEN" not in env and "AWS_SECRET_ACCESS_KEY" not in env
    assert env["PYTHONPATH"] != "/nowhere" and "/nowhere" not in env["PYTHONPATH"].split(":")


@pytest.mark.ray
@pytest.mark.slow
def test_every_process_of_the_cluster_listens_on_loopback_only(embedded: Embedded) -> None:
    # While a job holds a placement group: its driver and workers are processes of the nodes.
    run_id = submit(embedded.client, seconds=60, groups=[{"accelerators": 1, "cpus": 0}])
    wait_status(embedded.client, run_id, {"RUNNING"}, timeout=120)
    wait_for_log(embedded.client, run_id, "placed")
    pids = _cluster_pids(embedded.state)
    found = listeners(pids)
    print("\n".join(map(str, found)))
    # GCS, 2 raylets, their agents, the dashboard, the job's supervisor, driver and workers.
    assert len({x.pid for x in found}) >= 10, found
    assert any("ray::" in x.command and "Agent" not in x.command for x in found), found
    assert [str(x) for x in found if not x.loopback] == []
    embedded.client.post(f"/runs/{run_id}/cancel")
    wait_status(embedded.client, run_id, {"STOPPED"}, timeout=60)


def wait_for_log(client: TestClient, run_id: str, text: str) -> str:
    logs: str = wait_for(
        lambda: client.get(f"/runs/{run_id}/logs").text, lambda t: text in t, timeout=90
    )
    return logs


@pytest.mark.ray
@pytest.mark.slow
def test_rays_api_refuses_a_caller_without_the_token(embedded: Embedded) -> None:
    token = _token_file(embedded.state).read_text()
    dashboard = f"http://127.0.0.1:{embedded.settings.local_dashboard_port}"
    agent = f"http://127.0.0.1:{embedded.settings.local_ray_port + 10}"
    assert httpx.get(f"{dashboard}/api/jobs/", timeout=10).status_code == 401
    wrong = {"Authorization": "Bearer " + "0" * 64}
    assert httpx.get(f"{dashboard}/api/jobs/", headers=wrong, timeout=10).status_code == 403
    job = {"entrypoint": "echo owned", "submission_id": "outside-1"}
    assert httpx.post(f"{dashboard}/api/jobs/", json=job, timeout=10).status_code == 401
    assert httpx.post(f"{agent}/api/job_agent/jobs/", json=job, timeout=10).status_code == 401
    right = {"Authorization": f"Bearer {token}"}
    assert httpx.get(f"{dashboard}/api/jobs/", headers=right, timeout=10).status_code == 200
