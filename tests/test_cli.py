"""The ``rlrun`` command against a live service: ids, hostile names, JSON output, exit codes."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from service.app import create_app
from service.cli import app as cli
from service.cli import clean
from service.client import ApiError, Client
from service.cluster.local_ray import LocalRayCluster
from service.cluster.ray_jobs import RayJobs
from tests.conftest import make_settings
from tests.live import ServerThread

HOSTILE = "[/] [bold]x\x1b[31mred\x1b]0;title\x07\u202e"


def rlrun(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, list(args), env={"COLUMNS": "80", **(env or {})})
    if result.exception and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.stdout, result.stderr


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The API on SQLite with no Ray behind it: runs stay QUEUED."""
    db = tmp_path_factory.mktemp("cli") / "cli.db"
    settings = make_settings(f"sqlite:///{db}", "http://127.0.0.1:9", run_loops=False)
    with ServerThread(create_app(settings)) as url:
        yield url


def test_list_shows_full_ids_and_hostile_names_harmlessly(server: str) -> None:
    ids = [
        httpx.post(f"{server}/runs", json={"recipe": "test-script", "name": name}).json()["id"]
        for name in ("plain", HOSTILE)
    ]
    code, out, _ = rlrun("list", "--server", server)
    assert code == 0
    for run_id in ids:
        assert run_id in out  # whole, never cut with an ellipsis at 80 columns
    assert "\x1b" not in out and "\u202e" not in out
    # Markup is shown as text (the table may wrap it), escape sequences lose their ESC.
    code, out, _ = rlrun("list", "--server", server, env={"COLUMNS": "200"})
    assert "[/] [bold]x[31mred]0;title" in out
    code, out, _ = rlrun("list", "--server", server, "--output", "json")
    assert code == 0
    assert [r["id"] for r in json.loads(out)["items"]][:2] == ids[::-1]


def test_clean_removes_control_and_format_characters_but_keeps_what_it_is_told() -> None:
    assert clean("a\x1b[2Jb\x07c\u202ed\x9b") == "a[2Jbcd"
    assert clean("l1\n\tl2\r", keep="\n\t") == "l1\n\tl2"


def test_submit_yaml_with_preset_and_sets_dry_run_then_for_real(
    server: str, tmp_path: Path
) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text("recipe: test-script\nname: from yaml\n")
    code, out, _ = rlrun(
        "submit", str(spec), "--set", "seconds=1.5", "--set", "message=hi there",
        "--dry-run", "--output", "json", "--server", server,
    )  # fmt: skip
    assert code == 0, out
    plan = json.loads(out)
    assert plan["spec"]["seconds"] == 1.5 and plan["spec"]["message"] == "hi there"
    assert plan["command"][:2] == ["python3", "-c"]
    assert "queue_position" in plan["plan"]
    code, out, err = rlrun("submit", str(spec), "--server", server)
    assert code == 0
    run_id = out.strip()
    assert httpx.get(f"{server}/runs/{run_id}").json()["name"] == "from yaml"
    assert "QUEUED" in err


def test_a_refused_spec_exits_3_naming_each_field(server: str, tmp_path: Path) -> None:
    spec = tmp_path / "bad.json"
    spec.write_text(json.dumps({"recipe": "tiny-grpo"}))
    code, _, err = rlrun("submit", str(spec), "--set", "n=1", "--preset", "x", "--server", server)
    assert code == 3
    assert "Invalid run spec" in err
    assert "n: " in err and "preset" in err


def test_unreachable_service_exits_4(tmp_path: Path) -> None:
    code, _, err = rlrun("status", "r1", env={"RLRUN_URL": "http://127.0.0.1:9"})
    assert code == 4 and "cannot reach http://127.0.0.1:9" in err


def test_the_client_reads_the_service_calls_without_a_run(server: str) -> None:
    with Client(server) as client:
        assert client.healthz() == {"status": "ok"}
        ready = client.readyz()
        assert ready["checks"]["database"]["ok"] is True and ready["checks"]["ray"]["ok"] is False
        assert "tiny-grpo" in [r.name for r in client.recipes()]
        assert "rlrun_" in client.prometheus()
        with pytest.raises(ApiError) as caught:
            client.get_run("nope")
        assert caught.value.status == 404 and "nope" in caught.value.detail


def test_read_commands_answer_json_and_the_token_travels(server: str) -> None:
    run_id = httpx.post(f"{server}/runs", json={"recipe": "test-script"}).json()["id"]
    env = {"RLRUN_URL": server, "RLRUN_TOKEN": "tok"}
    code, out, _ = rlrun("status", run_id, "-o", "json", env=env)
    assert code == 0 and json.loads(out)["id"] == run_id
    code, out, _ = rlrun("cluster", "-o", "json", env=env)
    assert code == 0 and run_id in [q["id"] for q in json.loads(out)["queue"]]
    code, out, _ = rlrun("metrics", run_id, "--keys", "-o", "json", env=env)
    assert code == 0 and json.loads(out) == []
    code, out, _ = rlrun("metrics", run_id, "-k", "critic/score/mean", "-o", "json", env=env)
    assert code == 0 and json.loads(out) == {"run_id": run_id, "series": {"critic/score/mean": []}}
    code, out, _ = rlrun("script", run_id, env=env)
    assert code == 0 and out.startswith("#!/usr/bin/env bash") and run_id in out
    code, out, _ = rlrun("status", run_id, env=env)
    assert code == 0 and run_id in out and "QUEUED" in out
    code, out, _ = rlrun("cluster", env=env)
    assert code == 0 and run_id in out


@pytest.mark.ray
@pytest.mark.slow
def test_follow_exits_0_on_success_and_1_on_failure_and_logs_follow_to_the_end(
    ray_cluster: LocalRayCluster, ray: RayJobs, tmp_path: Path
) -> None:
    settings = make_settings(f"sqlite:///{tmp_path}/f.db", ray_cluster.address)
    with ServerThread(create_app(settings)) as url:
        ok, bad = tmp_path / "ok.json", tmp_path / "bad.json"
        ok.write_text(json.dumps({"recipe": "test-script", "seconds": 1, "message": "done"}))
        bad.write_text(
            json.dumps({"recipe": "test-script", "exit_code": 3, "message": "\x1b[31mboom"})
        )
        code, out, _ = rlrun("submit", str(ok), "--follow", "--server", url)
        assert code == 0, out
        assert "SUCCEEDED" in out
        code, out, _ = rlrun("submit", str(bad), "--server", url)
        failing = out.strip()
        code, out, _ = rlrun("status", failing, "--follow", "--server", url)
        assert code == 1, out
        assert "FAILED" in out
        code, out, _ = rlrun("logs", failing, "--follow", "--server", url)
        assert code == 0 and "boom" in out and "\x1b" not in out
        raw = httpx.get(f"{url}/runs/{failing}/logs", params={"ansi": "true"}).text
        assert "\x1b[31mboom" in raw
        code, out, _ = rlrun("status", failing, "--follow", "-o", "json", "--server", url)
        lines = [json.loads(line) for line in out.splitlines()]
        assert code == 1 and lines[-1]["event"] == "end"
        assert "FAILED" in [e["data"]["to_status"] for e in lines if e["event"] == "status"]
