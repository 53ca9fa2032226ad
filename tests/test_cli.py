"""The ``rlrun`` command against a live service: ids, hostile names, JSON output, exit codes."""

from __future__ import annotations

import gc
import json
import math
import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from fastapi import FastAPI
from typer.testing import CliRunner

from jobs import samples as job_samples
from service.app import create_app
from service.cli import app as cli
from service.cli import clean
from service.client import ApiError, Client
from service.cluster.local_ray import LocalRayCluster
from service.cluster.ray_jobs import RayJobs
from service.metrics import samples, store
from service.metrics.parse import MetricLine
from service.recipes.verl.hydra_check import FULLY_ASYNC_CONFIG
from service.store.db import Database
from service.store.models import RunLog, utcnow
from service.store.status import RunStatus
from tests.conftest import make_settings
from tests.factories import add_run, read_run
from tests.live import ServerThread

# Control characters are refused at the door; markup and a bidi override are not.
HOSTILE = "[/] [bold]x red\u202e"


def rlrun(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, list(args), env={"COLUMNS": "80", **(env or {})})
    if result.exception and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.stdout, result.stderr


@pytest.fixture(scope="module")
def server_db(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """The API on SQLite with no Ray behind it (runs stay QUEUED), and its database URL."""
    db_url = f"sqlite:///{tmp_path_factory.mktemp('cli') / 'cli.db'}"
    settings = make_settings(db_url, "http://127.0.0.1:9", run_loops=False)
    with ServerThread(create_app(settings)) as url:
        yield url, db_url


@pytest.fixture(scope="module")
def server(server_db: tuple[str, str]) -> str:
    return server_db[0]


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
    # Markup is shown as text (the table may wrap it), the bidi override is dropped.
    code, out, _ = rlrun("list", "--server", server, env={"COLUMNS": "200"})
    assert "[/] [bold]x red" in out
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
    code, out, _ = rlrun("metrics", run_id, "-o", "json", env=env)
    assert code == 0 and json.loads(out) == {"run_id": run_id, "step": None, "latest": {}}
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
            json.dumps({"recipe": "test-script", "exit_code": 3, "message": "<ESC>[31mboom"})
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


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (None, "no such file"),
        ("recipe: [unclosed\n", "not valid JSON or YAML"),
        ("- a list\n- of items\n", "must be a mapping"),
        (b"\xff\xfe bytes", "not UTF-8"),
        ("dir", "a directory"),
    ],
)
def test_a_bad_or_missing_spec_file_is_one_line_naming_it_and_exit_2(
    tmp_path: Path, content: str | bytes | None, problem: str
) -> None:
    spec = tmp_path / "spec.yaml"
    if content == "dir":
        spec.mkdir()
    elif isinstance(content, bytes):
        spec.write_bytes(content)
    elif content is not None:
        spec.write_text(content)
    code, out, err = rlrun("submit", str(spec), "--server", "http://127.0.0.1:9")
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1 and str(spec) in err and problem in err
    assert out == ""


def test_yaml_errors_say_where(tmp_path: Path) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text("recipe: tiny-grpo\nname: [unclosed\n")
    code, _, err = rlrun("submit", str(spec))
    assert code == 2 and "line 3" in err and "Traceback" not in err
    code, _, err = rlrun("submit", "-", "--set", "a=[x", "--server", "http://127.0.0.1:9")
    assert code == 2 and err.strip().startswith("--set a: not a YAML value")
    code, _, err = rlrun("submit", "-", "--set", "novalue")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "not key=value" in err


def test_logs_script_and_verl_answer_json(server: str, tmp_path: Path) -> None:
    run_id = httpx.post(f"{server}/runs", json={"recipe": "test-script"}).json()["id"]
    code, out, _ = rlrun("logs", run_id, "-o", "json", "--server", server)
    assert code == 0 and json.loads(out) == {"run_id": run_id, "text": "", "complete": False}
    code, out, _ = rlrun("script", run_id, "-o", "json", "--server", server)
    body = json.loads(out)
    assert code == 0 and body["run_id"] == run_id
    assert body["script"].startswith("#!/usr/bin/env bash")
    # A release already in the cache answers without downloading it.
    config = tmp_path / "0.0.1" / "verl" / FULLY_ASYNC_CONFIG
    config.mkdir(parents=True)
    (config / "fully_async_ppo_trainer.yaml").write_text("{}\n")
    code, out, _ = rlrun(
        "verl", "add", "0.0.1", "-o", "json", env={"RLRUN_VERL_CACHE_DIR": str(tmp_path)}
    )
    assert code == 0 and json.loads(out) == {
        "version": "0.0.1",
        "path": str(tmp_path / "0.0.1" / "verl"),
    }


def test_list_and_cluster_never_cut_an_id_or_split_a_word_when_narrow(server: str) -> None:
    name = "a rather long descriptive run name"
    ids = [
        httpx.post(
            f"{server}/runs", json={"recipe": "test-script", "name": name, "team": "default"}
        ).json()["id"]
        for _ in range(2)
    ]
    for columns in ("40", "60", "80", "200"):
        env = {"COLUMNS": columns}
        code, out, _ = rlrun("list", "--server", server, env=env)
        assert code == 0
        lines = out.splitlines()
        assert lines[0].split()[0] == "id" and "status" in lines[0].split()
        for run_id in ids:
            assert any(line.startswith(run_id + " ") for line in lines), (columns, out)
            assert any(run_id in line and "QUEUED" in line for line in lines)
        for word in ("default", "QUEUED", "test-script", "descriptive"):
            assert all(word in line or word[:4] not in line for line in lines), (columns, out)
        if int(columns) <= 60:
            assert "recipe" not in lines[0]  # a narrow column dropped, not wrapped
        if columns == "200":
            assert name in out and "recipe" in lines[0]
        code, out, _ = rlrun("cluster", "--server", server, env=env)
        assert code == 0
        for run_id in ids:
            assert any(run_id in line.split() for line in out.splitlines()), (columns, out)


def test_metrics_shows_every_key_latest_value_and_keys_filters(
    server_db: tuple[str, str],
) -> None:
    server, db_url = server_db
    run_id = httpx.post(f"{server}/runs", json={"recipe": "test-script"}).json()["id"]
    db = Database(db_url)
    values = {f"custom/k{i}": float(i) for i in range(15)} | {"actor/grad_norm": math.nan}
    with db.transaction() as session:
        store.add_lines(session, run_id, [(10, MetricLine(1, {"critic/score/mean": 0.1}))])
        store.add_lines(session, run_id, [(20, MetricLine(2, values))])
    db.dispose()
    code, out, _ = rlrun("metrics", run_id, "--server", server, "-o", "json")
    body = json.loads(out)
    assert code == 0 and body["run_id"] == run_id and body["step"] == 2
    assert len(body["latest"]) == 17
    assert body["latest"]["critic/score/mean"] == {"step": 1, "value": 0.1}
    assert body["latest"]["actor/grad_norm"] == {"step": 2, "value": "NaN"}
    code, out, _ = rlrun("metrics", run_id, "--server", server)
    assert code == 0 and "custom/k14" in out and "actor/grad_norm" in out and "NaN" in out
    code, out, _ = rlrun(
        "metrics", run_id, "--keys", "critic/*,custom/k1", "--server", server, "-o", "json"
    )
    assert sorted(json.loads(out)["latest"]) == ["critic/score/mean", "custom/k1"]
    code, out, _ = rlrun("metrics", run_id, "--keys", "none/*", "--server", server)
    assert code == 0 and "no key matches" in out


def test_samples_lists_a_runs_samples_filtered_and_whole_in_json(
    server_db: tuple[str, str],
) -> None:
    server, db_url = server_db
    run_id = httpx.post(f"{server}/runs", json={"recipe": "test-script"}).json()["id"]
    framed = [
        job_samples.PREFIX
        + json.dumps(
            {"input": "2+2=\x1b[31m", "output": "4" * 300, "gts": "4", "score": s, "step": step}
        )
        for step, s in ((1, 0.0), (1, 1.0), (2, 1.0))
    ]
    db = Database(db_url)
    with db.transaction() as session:
        runlog = RunLog(run_id=run_id, log_offset=0)
        session.add(runlog)
        session.flush()
        samples.ingest(session, runlog, samples.parse(framed), samples.Bounds())
    db.dispose()
    code, out, _ = rlrun("samples", run_id, "--server", server)
    assert code == 0 and "3 samples kept" in out and "\x1b" not in out
    code, out, _ = rlrun(
        "samples", run_id, "--step", "1", "--min-score", "0.5", "--server", server, "-o", "json"
    )
    body = json.loads(out)
    assert code == 0 and [(s["step"], s["score"]) for s in body["items"]] == [(1, 1.0)]
    assert body["items"][0]["output"] == "4" * 300


def test_serve_refuses_a_busy_port_in_one_line_before_start_up(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        env = {
            "RLRUN_DATABASE_URL": f"sqlite:///{tmp_path}/s.db",
            "RLRUN_RAY_ADDRESS": "http://127.0.0.1:9",
        }
        code, _, err = rlrun("serve", "--port", str(port), env=env)
    assert code == 2
    assert err.strip() == f"port {port} on 127.0.0.1 is in use: pick another with --port"
    code, out, _ = rlrun("serve", "--help", env={"COLUMNS": "200"})
    assert "--port" in out and "8000" in out


def test_serve_puts_what_start_up_made_out_of_the_collectors_sight(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    served: dict[str, Any] = {}

    def run(app: Any, **_: Any) -> None:
        served["app"], served["frozen"] = app, gc.get_freeze_count()

    monkeypatch.setattr(uvicorn, "run", run)
    switch = sys.getswitchinterval()
    env = {"RLRUN_DATABASE_URL": f"sqlite:///{tmp_path}/s.db", "RLRUN_RAY_ADDRESS": "local"}
    try:
        code, _, err = rlrun("serve", "--port", "0", env=env)
    finally:
        gc.unfreeze()
        sys.setswitchinterval(switch)
    assert code == 0, err
    # The modules and the app are frozen before serving: a full collection skips them.
    assert isinstance(served["app"], FastAPI) and served["frozen"] > 50_000


def test_retry_starts_the_next_attempt_of_an_ended_run_only(server: str) -> None:
    env = {"RLRUN_URL": server}
    run_id = httpx.post(f"{server}/runs", json={"recipe": "test-script"}).json()["id"]
    code, _, err = rlrun("retry", run_id, env=env)
    assert code != 0 and "has not ended" in err  # queued: 409
    httpx.post(f"{server}/runs/{run_id}/cancel")
    code, out, _ = rlrun("retry", run_id, "--from", "scratch", env=env)
    assert code == 0 and "QUEUED" in out and "attempt 2 from scratch" in out
    httpx.post(f"{server}/runs/{run_id}/cancel")
    code, out, _ = rlrun("retry", run_id, "-o", "json", env=env)
    run = json.loads(out)
    assert code == 0 and run["attempt"] == 3 and run["ray"]["submission_id"] == f"{run_id}-a3"
    assert [a["status"] for a in run["attempts"]] == ["CANCELLED", "CANCELLED", "QUEUED"]


def test_cancel_at_checkpoint_sends_the_stop_and_its_limit_and_refuses_within_alone(
    server_db: tuple[str, str],
) -> None:
    server, db_url = server_db
    db = Database(db_url)
    try:
        for run_id in ("yield-90", "yield-default", "yield-alone"):
            add_run(db, run_id, RunStatus.RUNNING)
        sent = utcnow()
        code, out, err = rlrun(
            "cancel", "yield-90", "--at-checkpoint", "--within", "90", "--server", server
        )
        assert code == 0, err
        assert "yield-90" in out and "stops at its next checkpoint by " in out, out
        run, reasons = read_run(db, "yield-90")
        # What reached the service: a stop at the next checkpoint within 90 s, not a stop now.
        assert run.stop_requested_at is None and run.status == RunStatus.RUNNING
        assert run.yield_by is not None
        waits = run.yield_by.replace(tzinfo=None) - sent.replace(tzinfo=None)
        assert abs(waits.total_seconds() - 90) < 30
        assert "within 90 s" in reasons[-1], reasons
        # Without --within the service's own limit applies (RLRUN_DEFAULT_STOP_WITHIN_S).
        code, out, _ = rlrun(
            "cancel", "yield-default", "--at-checkpoint", "--server", server, "--output", "json"
        )
        assert code == 0
        doc = json.loads(out)
        assert doc["stop"]["at"] == "next_checkpoint" and doc["stop_requested"] is False
        assert "within 1800 s" in read_run(db, "yield-default")[1][-1]
        # --within alone, or a negative one, is refused before anything is sent.
        before = read_run(db, "yield-alone")
        for args in (["--within", "5"], ["--at-checkpoint", "--within", "-1"]):
            code, _, err = rlrun("cancel", "yield-alone", *args, "--server", server)
            assert code == 2 and "--within" in err, err
        after = read_run(db, "yield-alone")
        assert (after[0].yield_by, after[0].stop_requested_at, after[1]) == (
            before[0].yield_by,
            before[0].stop_requested_at,
            before[1],
        )
    finally:
        db.dispose()
