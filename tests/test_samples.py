"""Rollout samples: the job's shipper, the follower's store with its bounds, the API, on SQLite
and PostgreSQL; hostile sample lines are skipped and counted, nothing else is lost."""

from __future__ import annotations

import fcntl
import io
import json
import math
import os
import time
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, event, func, select
from sqlalchemy.orm import Session

from jobs import samples as job
from service.loops.follower import Follower
from service.metrics import logcopy, samples
from service.metrics.health import HealthRules
from service.metrics.log_readers import WholeLogReader
from service.metrics.parse import parse_line
from service.store.db import Database, upgrade
from service.store.models import TEXT_SEARCH_INDEXES, MetricPoint, RunLog, RunSample
from tests.factories import add_run, read_run
from tests.fake_ray import FakeRay


def line(step: int, score: Any = 1.0, text: str = "2+2=", out: str = "4", **extra: Any) -> str:
    return json.dumps(
        {"input": text, "output": out, "gts": "4", "score": score, "step": step, **extra}
    )


def follower(db: Database, ray: FakeRay, bounds: samples.Bounds | None = None) -> Follower:
    return Follower(
        db,
        ray,
        "one",
        30,
        100_000,
        HealthRules(),
        reader=WholeLogReader(ray),
        sample_bounds=bounds or samples.Bounds(),
    )


def shipped(tmp_path: Path, files: dict[int, list[bytes]], per_step: int = 64) -> list[str]:
    for step, lines in files.items():
        (tmp_path / f"{step}.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    out = io.StringIO()
    job.ship_once(str(tmp_path), 1, per_step, ["s3cr3t-value"], out, settle_s=0)
    return out.getvalue().splitlines()


# The job's side


def test_each_kind_of_bad_line_is_skipped_with_its_reason_and_the_good_ones_are_kept() -> None:
    assert job.read_sample(b"{not json") == "not_json"
    assert job.read_sample(b"\xff\xfe" + line(1).encode()) == "not_utf8"
    assert job.read_sample(line(1, math.nan)) == "bad_score"
    assert job.read_sample('{"score": NaN, "step": 1}') == "bad_score"
    assert job.read_sample(line(1, "0.5")) == "bad_score"
    assert job.read_sample(line(1, True)) == "bad_score"
    assert job.read_sample(b"x" * (job.MAX_LINE_BYTES + 1)) == "too_long"
    assert job.read_sample("[1, 2]") == "not_object"
    assert job.read_sample(line(-1)) == "bad_step"
    good = job.read_sample(line(3, 0.25, acc=1, pred="4"))
    assert isinstance(good, dict)
    assert good["score"] == 0.25 and good["extras"] == {"acc": 1.0, "pred": "4"}


def test_text_is_cut_at_the_bound_and_marked_and_secret_values_masked() -> None:
    got = job.read_sample(line(1, text="key s3cr3t-value " + "x" * 9000), secrets=["s3cr3t-value"])
    assert isinstance(got, dict)
    assert len(got["input"]) == job.FIELD_CHARS and got["cut"] == ["input"]
    assert "s3cr3t-value" not in got["input"] and got["input"].startswith("key *** x")


def test_a_50_mb_line_is_skipped_without_losing_the_lines_around_it(tmp_path: Path) -> None:
    big = b'{"input": "' + b"a" * (50 << 20) + b'"}'
    framed = shipped(
        tmp_path,
        {
            1: [
                line(1, 1.0).encode(),
                big,
                b"not json",
                b"\xc3\x28",
                line(1, "high").encode(),
                line(1, 0.0).encode(),
            ]
        },
    )
    parsed = samples.parse(framed)
    assert [s["score"] for s in parsed.samples] == [1.0, 0.0]
    assert all(s["of"] == 2 for s in parsed.samples)
    assert parsed.skipped == {"too_long": 1, "not_json": 1, "not_utf8": 1, "bad_score": 1}


def test_the_shipper_ships_each_step_once_bounded_and_every_nth(tmp_path: Path) -> None:
    framed = shipped(tmp_path, {1: [line(1).encode()] * 5, 2: [line(2).encode()] * 5}, per_step=3)
    assert [s["step"] for s in samples.parse(framed).samples] == [1, 1, 1, 2, 2, 2]
    assert shipped(tmp_path, {}) == []  # a later holder of the lock goes on after them
    (tmp_path / "3.jsonl").write_text(line(3) + "\n")
    (tmp_path / "4.jsonl").write_text(line(4) + "\n")
    out = io.StringIO()
    job.ship_once(str(tmp_path), 2, 8, [], out, settle_s=0)
    assert [s["step"] for s in samples.parse(out.getvalue().splitlines()).samples] == [4]


def test_a_file_still_being_written_waits(tmp_path: Path) -> None:
    (tmp_path / "1.jsonl").write_text(line(1) + "\n")
    out = io.StringIO()
    assert job.ship_once(str(tmp_path), 1, 8, [], out, settle_s=60) == 0
    os.utime(tmp_path / "1.jsonl", (time.time() - 120, time.time() - 120))
    assert job.ship_once(str(tmp_path), 1, 8, [], out, settle_s=60) == 1


def test_a_step_shipped_while_another_writer_has_a_line_open_leaves_both_whole(
    tmp_path: Path,
) -> None:
    # print() writes its text and its newline apart: the shipper's write can fall in between.
    (tmp_path / "1.jsonl").write_text(line(1) + "\n" + line(1, 0.0) + "\n")
    log = tmp_path / "driver.log"
    with log.open("w") as out:
        out.write("(TinyGrpo pid=7) step:1 - critic/score/mean:0.5")
        out.flush()
        assert job.ship_once(str(tmp_path), 1, 8, [], out, settle_s=0) == 1
        out.write("\n")
    lines = log.read_text().splitlines()
    assert [s["score"] for s in samples.parse(lines).samples] == [1.0, 0.0]
    got = parse_line(lines[0])
    assert got is not None and got.values == {"critic/score/mean": 0.5}, lines[0]


# The service's side


def test_the_follower_stores_samples_apart_from_the_kept_log_and_counts_bad_frames(
    db: Database,
) -> None:
    run_id, ray = add_run(db), FakeRay()
    frames = [job.PREFIX + json.dumps({**json.loads(line(1, s)), "of": 3}) for s in (1, 0, 1)]
    ray.log[run_id] = (
        "hello\n"
        # Ray colours the prefix of a line it forwards from an actor.
        + "".join(f"\x1b[36m(FullyAsyncTrainer pid=7)\x1b[0m {f}\n" for f in frames)
        + "step:1 - critic/score/mean:0.6666666666666666\n"
        + f"{job.PREFIX}{{broken\n"
        + f"{job.PREFIX}{line(1, 'NaN')}\n"
        + f"{job.PREFIX}"
        + json.dumps({"input": "step:9 - x:1", "output": "", "score": 0, "step": 2})
        + "\n"
        + "bye\n"
    )
    follower(db, ray).tick()
    with db.transaction() as s:
        rows = list(s.scalars(select(RunSample).order_by(RunSample.id)))
        kept = logcopy.tail(s, run_id, None)
        runlog = s.get(RunLog, run_id)
        assert runlog is not None
        counters = (runlog.samples_kept, runlog.samples_skipped, runlog.log_offset)
        points = s.scalar(select(func.count()).select_from(MetricPoint))
    assert [(r.step, r.score) for r in rows] == [(1, 1.0), (1, 0.0), (1, 1.0), (2, 0.0)]
    assert kept == "hello\nstep:1 - critic/score/mean:0.6666666666666666\nbye\n"
    assert counters == (4, 2, len(ray.log[run_id]))
    assert points == 1  # a sample's text is never a metric line
    _, reasons = read_run(db, run_id)
    assert any(r.startswith("rollout sample lines skipped (not_json)") for r in reasons)
    assert any(r.startswith("rollout sample lines skipped (bad_score)") for r in reasons)


def test_past_the_run_cap_old_steps_are_thinned_never_the_newest(db: Database) -> None:
    run_id, ray = add_run(db), FakeRay()
    ray.log[run_id] = "".join(f"{job.PREFIX}{line(step)}\n" for step in range(1, 11) for _ in "ab")
    follower(db, ray, samples.Bounds(per_step=2, per_run=12)).tick()
    ray.log[run_id] += "".join(f"{job.PREFIX}{line(11)}\n" for _ in range(5))
    follower(db, ray, samples.Bounds(per_step=2, per_run=12)).tick()
    with db.transaction() as s:
        steps = list(s.scalars(select(RunSample.step).order_by(RunSample.id)))
        runlog = s.get(RunLog, run_id)
        assert runlog is not None
        assert runlog.samples_kept == len(steps) <= 12
        assert runlog.samples_chars == sum(s.scalars(select(RunSample.chars)))
        assert runlog.samples_skipped == 3  # step 11's samples past the per-step cap
    assert steps[-2:] == [11, 11] and 1 in steps
    assert len(set(steps)) < 11
    # The per-step rows the ingest kept are what the samples held say, thinned steps gone.
    with db.read() as s:
        assert samples.steps(s, run_id) == held_steps(s, run_id)


def held_steps(session: Session, run_id: str) -> list[dict[str, Any]]:
    """The per-step scores counted from the samples themselves."""
    got = session.execute(
        select(
            RunSample.step,
            func.count(),
            func.sum(RunSample.score),
            func.min(RunSample.score),
            func.max(RunSample.score),
            func.max(RunSample.of),
        )
        .where(RunSample.run_id == run_id)
        .group_by(RunSample.step)
        .order_by(RunSample.step)
    )
    return [
        {"step": st, "count": n, "mean": total / n, "min": lo, "max": hi, "of": of}
        for st, n, total, lo, hi, of in got
    ]


def seed(db: Database, run_id: str, n: int = 30) -> None:
    framed = [
        f"{job.PREFIX}{line(1 + i // 10, (i % 4) / 4, text=f'prompt {i % 3}', out=f'resp {i}')}"
        for i in range(n)
    ]
    with db.transaction() as s:
        runlog = RunLog(run_id=run_id, log_offset=0)
        s.add(runlog)
        s.flush()
        samples.ingest(s, runlog, samples.parse(framed), samples.Bounds())


def test_the_api_pages_and_filters_samples(api: TestClient, db_url: str) -> None:
    run_id = api.post("/runs", json={"recipe": "tiny-grpo"}).json()["id"]
    db = Database(db_url)
    try:
        seed(db, run_id)
    finally:
        db.dispose()
    first = api.get(f"/runs/{run_id}/samples", params={"limit": 20, "steps": "true"}).json()
    assert first["kept"] == 30 and first["skipped"] == 0 and len(first["items"]) == 20
    assert [s["step"] for s in first["steps"]] == [1, 2, 3]
    assert first["items"][0]["output"] == "resp 29"
    rest = api.get(f"/runs/{run_id}/samples", params={"cursor": first["next_cursor"]}).json()
    assert len(rest["items"]) == 10 and rest["next_cursor"] is None
    step2 = api.get(f"/runs/{run_id}/samples", params={"step": 2, "min_score": 0.5}).json()
    assert {(s["step"], s["score"]) for s in step2["items"]} == {(2, 0.5), (2, 0.75)}
    same = first["items"][0]["prompt_id"]
    across = api.get(f"/runs/{run_id}/samples", params={"prompt_id": same}).json()["items"]
    assert {s["input"] for s in across} == {"prompt 2"} and len(across) == 10
    found = api.get(f"/runs/{run_id}/samples", params={"q": "resp 1_"}).json()["items"]
    assert found == []  # `_` is a character, not a wildcard
    found = api.get(f"/runs/{run_id}/samples", params={"q": "resp 1"}).json()["items"]
    assert {s["output"] for s in found} == {"resp 1", *(f"resp 1{i}" for i in range(10))}


def test_bad_sample_queries_are_problems_naming_the_field(api: TestClient) -> None:
    run_id = api.post("/runs", json={"recipe": "tiny-grpo"}).json()["id"]
    for params, field in (
        ({"min_score": 1, "max_score": 0}, "max_score"),
        ({"prompt_id": "<script>"}, "prompt_id"),
        ({"limit": 100_000}, "limit"),
    ):
        got = api.get(f"/runs/{run_id}/samples", params=params)
        assert got.status_code == 422, got.text
        assert got.headers["content-type"].startswith("application/problem+json")
        assert field in json.dumps(got.json())
    assert api.get("/runs/nope/samples").status_code == 404


def test_a_spec_with_bad_samples_options_is_refused_with_the_field_path(api: TestClient) -> None:
    for samples_option, field in (({"every": 0}, "every"), ({"per_step": 5000}, "per_step")):
        got = api.post("/runs", json={"recipe": "tiny-grpo", "samples": samples_option})
        assert got.status_code == 422, got.text
        assert got.headers["content-type"].startswith("application/problem+json")
        assert f"samples.{field}" in json.dumps(got.json()) or field in json.dumps(got.json())


def test_a_score_filter_reads_the_index_and_the_per_step_scores_a_row_a_step(
    sqlite_db: Database,
) -> None:
    run_id = add_run(sqlite_db, "indexed")
    seed(sqlite_db, run_id)
    seen: list[tuple[str, Any]] = []

    def record(_conn: object, _cursor: object, sql: str, params: Any, *_: object) -> None:
        if "run_sample" in sql:
            seen.append((sql, params))

    engine = sqlite_db.engines[0]
    event.listen(engine, "before_cursor_execute", record)
    with sqlite_db.read() as s:
        samples.page(s, run_id, samples.Query(min_score=0.5, max_score=0.9))
        per_step = samples.steps(s, run_id)
        assert per_step == held_steps(s, run_id)
        assert [x["count"] for x in per_step] == [10, 10, 10]
    event.remove(engine, "before_cursor_execute", record)
    with engine.connect() as conn:
        plans = [
            " ".join(row[-1] for row in conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {sql}", params))
            for sql, params in seen
        ]
    assert "ix_run_samples_run_id_score" in plans[0], plans
    # The per-step scores: the rows the ingest keeps, a row a step, by their primary key.
    assert "run_samples " not in seen[1][0] and "run_sample_steps" in seen[1][0], seen[1]
    assert "sqlite_autoindex_run_sample_steps_1" in plans[1], plans


def test_the_text_filter_is_any_case_and_has_trigram_indexes_on_postgresql(db: Database) -> None:
    run_id = add_run(db, "texts")
    seed(db, run_id, n=3000)  # outputs "resp 0" .. "resp 2999"

    def page(q: str) -> list[str]:
        with db.read() as s:
            return [r.output for r in samples.page(s, run_id, samples.Query(q=q, limit=500))[0]]

    assert page("RESP 123") == ["resp 1239", "resp 1238", "resp 1237", "resp 1236", "resp 1235",
                                "resp 1234", "resp 1233", "resp 1232", "resp 1231", "resp 1230",
                                "resp 123"]  # fmt: skip
    assert page("50%") == page("resp_1") == []  # % and _ are text, not patterns
    if db.engines[0].dialect.name == "postgresql":  # what serves a rare text: bench_samples
        with db.engines[0].connect() as conn:
            names = set(
                conn.exec_driver_sql(
                    "SELECT indexname FROM pg_indexes WHERE tablename = 'run_samples'"
                ).scalars()
            )
        assert names >= TEXT_SEARCH_INDEXES, names


def test_without_pg_trgm_the_migration_goes_on_and_the_text_filter_scans(
    pg_admin_url: str,
) -> None:
    # A role that may make tables but not extensions (no CREATE on the database), as on a
    # managed server whose operator keeps extensions to themselves.
    name = f"rlrun_noext_{os.urandom(4).hex()}"
    admin = create_engine(pg_admin_url, isolation_level="AUTOCOMMIT")
    base = pg_admin_url.rsplit("/", 1)[0]
    with admin.connect() as conn:
        conn.exec_driver_sql(f'CREATE ROLE "{name}" LOGIN')
        conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    owner = create_engine(f"{base}/{name}", isolation_level="AUTOCOMMIT")
    with owner.connect() as conn:
        conn.exec_driver_sql(f'GRANT CREATE ON SCHEMA public TO "{name}"')
    owner.dispose()
    url = f"{base.split('//')[0]}//{name}@{base.split('@', 1)[1]}/{name}"
    try:
        upgrade(url)
        db = Database(url)
        try:
            with db.engines[0].connect() as conn:
                names = set(
                    conn.exec_driver_sql(
                        "SELECT indexname FROM pg_indexes WHERE tablename = 'run_samples'"
                    ).scalars()
                )
            assert not names & TEXT_SEARCH_INDEXES, names
            run_id = add_run(db, "texts")
            seed(db, run_id)
            with db.read() as s:
                rows, _ = samples.page(s, run_id, samples.Query(q="Resp 2"))
            assert [r.output for r in rows] == [
                f"resp {i}" for i in (29, 28, 27, 26, 25, 24, 23, 22, 21, 20, 2)
            ]
        finally:
            db.dispose()
    finally:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE "{name}" WITH (FORCE)')
            conn.exec_driver_sql(f'DROP ROLE "{name}"')
        admin.dispose()


def test_the_steps_the_shippers_left_are_shipped_once_verl_has_exited(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    for step in (1, 2, 3):
        (tmp_path / f"{step}.jsonl").write_text(line(step, text="key s3cr3t-value") + "\n")
    (tmp_path / ".rlrun-shipped").write_text("1\n2\n")  # the workers' shipper did these
    environ = job.env(str(tmp_path), 1, 8, {"API_KEY": "s3cr3t-value"}) | {
        "API_KEY": "s3cr3t-value"
    }
    # A shipper still alive holds the lock (flock: per open file): it ships them itself.
    with (tmp_path / ".rlrun-ship.lock").open("a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        started = time.monotonic()
        assert job.ship_left(environ, wait_s=0.3) == 0
        assert time.monotonic() - started < 2
    assert capfd.readouterr().out == ""
    assert job.ship_left(environ, wait_s=0.3) == 1
    out = capfd.readouterr().out
    assert [s["step"] for s in samples.parse(out.splitlines()).samples] == [3]
    assert "s3cr3t-value" not in out and job.MASK in out
    assert job.ship_left(environ) == 0  # shipped once
