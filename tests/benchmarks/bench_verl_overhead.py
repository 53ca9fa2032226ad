"""The service's overhead on a real verl run: the same cpu-smoke job (verl's own fully async
trainer on CPU) submitted by hand, with ``ray job submit`` from the script the service exports
(``GET /runs/{id}/script``), and through the service (``POST /runs``), one after the other on
the same embedded Ray head. Per job: start-up (submit to verl's first ``step:`` line in Ray's job
log, both read the same way, every 0.5 s) and per-step time (verl's own ``timing_s/step``), and
the ratios. Goal: per-step within 2 %, start-up at most 5 s more.

    PYTHONPATH=$PWD python -m tests.benchmarks.bench_verl_overhead [--quick]

The full run takes the host's verl lock (two verl runs, about 10 minutes, 11 GB at peak).
``--quick`` (what CI runs, seconds, no verl): the cpu-smoke launch as the service's submitter
hands it to Ray and as the exported script hands it to ``ray job submit`` (run with a stand-in
``ray`` that records its arguments) must be the same job: entrypoint, runtime env (the ``jobs``
package as the service uploads it and as the script finds it installed) and entrypoint
resources; it exits non-zero otherwise.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from service.api.script import render_script
from service.cluster.inventory_cache import InventoryCache
from service.cluster.ray_jobs import RayJobs
from service.metrics.parse import parse_line, parse_synced
from service.recipes.base import LaunchContext
from service.recipes.registry import default_registry
from service.scheduling.admission import Quotas
from service.settings import Settings
from service.store.db import Database, upgrade
from service.store.status import RunStatus
from tests.benchmarks.report import Report, table
from tests.factories import add_run
from tests.fake_ray import FakeRay

ROOT = Path(__file__).resolve().parents[2]
SMOKE = {"recipe": "verl-fully-async", "preset": "cpu-smoke", "name": "cpu-smoke"}
POLL_S = 0.5
# A stand-in for the `ray` CLI: records its arguments as JSON.
RAY_STANDIN = (
    "#!{python}\nimport json, os, sys\njson.dump(sys.argv[1:], open(os.environ['RAY_ARGS'], 'w'))\n"
)


# --- quick: the two submissions of one launch compared --------------------------------------


def service_submission(launch: dict[str, Any], run_id: str) -> dict[str, Any]:
    """What the service's submitter sends Ray for this launch (its real code, Ray in memory)."""
    from service.loops.submitter import Submitter

    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{tmp}/bench.db"
        upgrade(url)
        db = Database(url)
        add_run(db, run_id, RunStatus.QUEUED, launch=launch, spec=dict(SMOKE))
        ray = FakeRay({"n1": {"NPU": 8.0, "CPU": 64.0}})
        Submitter(db, ray, InventoryCache(ray, 0.0), Quotas(), "bench", 30.0, 10).tick()
        db.dispose()
    (sent,) = ray.submitted
    sent["entrypoint_num_cpus"] = launch.get("entrypoint_num_cpus", 0.0)  # as the submitter passes
    return sent


def script_submission(launch: dict[str, Any], run_id: str) -> dict[str, Any]:
    """What the exported script hands ``ray job submit`` for this launch (run with a stand-in)."""
    with tempfile.TemporaryDirectory() as tmp:
        bin_dir = Path(tmp) / "bin"
        bin_dir.mkdir()
        ray = bin_dir / "ray"
        ray.write_text(RAY_STANDIN.format(python=sys.executable))
        ray.chmod(0o755)
        script = Path(tmp) / "submit.sh"
        script.write_text(render_script(run_id, "cpu-smoke", launch))
        env = os.environ | {
            "PATH": f"{bin_dir}:{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",
            "PYTHONPATH": str(ROOT),
            "RAY_ARGS": str(Path(tmp) / "args.json"),
        }
        subprocess.run(["bash", str(script)], env=env, check=True, capture_output=True)
        args: list[str] = json.loads((Path(tmp) / "args.json").read_text())
    assert args[:2] == ["job", "submit"], args
    cut = args.index("--")
    options, entrypoint = args[2:cut], args[cut + 1 :]
    named = dict(zip(options[0::2], options[1::2], strict=True))
    return {
        "submission_id": named["--submission-id"],
        # As Ray's CLI joins them (ray/dashboard/modules/job/cli.py).
        "entrypoint": shlex.join(entrypoint),
        "runtime_env": json.loads(named["--runtime-env-json"]),
        "entrypoint_resources": json.loads(named.get("--entrypoint-resources", "null")),
        "entrypoint_num_cpus": float(named.get("--entrypoint-num-cpus", 0.0)),
    }


def jobs_package(runtime_env: dict[str, Any]) -> dict[str, Any]:
    """``runtime_env`` with the ``jobs`` package named alike: the service uploads it (a
    ``gcs://`` URI), the script names the installed dir; both are the same package."""
    out = dict(runtime_env)
    out["py_modules"] = [
        "<jobs>" if m.rstrip("/").endswith("jobs") or "_jobs" in m or "jobs.zip" in m else m
        for m in runtime_env.get("py_modules", [])
    ]
    return out


def compare(settings: Settings) -> list[tuple[str, str, str]]:
    """(what, the service's, the script's) for each part of the submission of cpu-smoke."""
    run_id = "rbench0000000000000a"
    _, built = default_registry((), settings).build(SMOKE, LaunchContext(run_id))
    launch = built.as_dict()
    service, script = service_submission(launch, run_id), script_submission(launch, run_id)
    rows = []
    for what, of in [
        ("submission id", lambda s: s["submission_id"]),
        ("entrypoint", lambda s: s["entrypoint"]),
        ("runtime env vars", lambda s: s["runtime_env"].get("env_vars", {})),
        ("runtime env (jobs package alike)", lambda s: jobs_package(s["runtime_env"])),
        ("entrypoint resources", lambda s: s["entrypoint_resources"] or {}),
        ("entrypoint CPUs", lambda s: float(s["entrypoint_num_cpus"] or 0.0)),
    ]:
        a, b = of(service), of(script)
        rows.append((what, json.dumps(a, sort_keys=True), json.dumps(b, sort_keys=True)))
    return rows


def quick(report: Report) -> None:
    settings = Settings(
        verl_data_dir="/data", verl_model_dir="/data", verl_checkpoint_root="/checkpoints"
    )
    started = time.perf_counter()
    rows = compare(settings)
    differ = [what for what, a, b in rows if a != b]
    for what, _, _ in rows:
        report.add(f"{what}: service = script", "yes" if what not in differ else "NO")
    report.add("entrypoint length (characters)", str(len(json.loads(rows[1][1]))))
    report.add("compared in", f"{time.perf_counter() - started:.1f} s")
    report.skip("per-step and start-up time, hand vs service", "--quick runs no verl")
    report.print()
    if differ:
        for what, a, b in rows:
            if what in differ:
                print(f"\n{what} differs:\n  service: {a[:2000]}\n  script:  {b[:2000]}")
        raise SystemExit(1)


# --- full: two real verl runs on one head --------------------------------------------------


def first_step_and_steps(text: str) -> tuple[bool, list[float]]:
    """Whether verl printed a ``step:`` line yet, and its ``timing_s/step`` per step."""
    started, per_step = False, []
    for line in text.splitlines():
        parsed = parse_line(line)
        if parsed is None or parse_synced(line) is not None:
            continue
        started = True
        if "timing_s/step" in parsed.values:
            per_step.append(parsed.values["timing_s/step"])
    return started, per_step


def follow(ray: RayJobs, job: str, since: float, timeout: float = 1500) -> dict[str, Any]:
    """Read ``job``'s log every ``POLL_S`` until it ends: start-up (``since`` to its first
    ``step:`` line), verl's per-step times, its status, the whole run."""
    startup = None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        info = ray.get(job)
        text = ray.logs(job) or ""
        started, per_step = first_step_and_steps(text)
        if started and startup is None:
            startup = time.monotonic() - since
        if info is not None and info.status in {"SUCCEEDED", "FAILED", "STOPPED"}:
            return {
                "status": info.status,
                "startup": startup,
                "per_step": per_step,
                "total": time.monotonic() - since,
            }
        time.sleep(POLL_S)
    raise SystemExit(f"{job} did not end in {timeout:g} s")


def full(report: Report) -> None:
    from tests.verl_run import LOCK, start_service

    lock = LOCK.open("w")
    print(f"waiting for the verl lock {LOCK} ...", flush=True)
    fcntl.flock(lock, fcntl.LOCK_EX)
    root, service = start_service("rlrun-verl-bench-")
    try:
        with httpx.Client(base_url=service.url, timeout=60) as http:
            address = f"http://127.0.0.1:{service.env['RLRUN_LOCAL_DASHBOARD_PORT']}"
            token = (root / "r" / "ray-token").read_text().strip()
            ray = RayJobs(address, token)
            # Through the service.
            since = time.monotonic()
            run_id = http.post("/runs", json=SMOKE).json()["id"]
            served = follow(ray, run_id, since)
            report.add("through the service", json.dumps(served | {"per_step": None}))
            # By hand: the script the service exports, its own submission id, a fresh
            # checkpoint dir (the service's run's is set aside: verl would resume from it).
            checkpoints = root / "checkpoints" / run_id
            checkpoints.rename(checkpoints.with_name(run_id + ".service"))
            script = http.get(f"/runs/{run_id}/script").text
            hand_id = run_id + "-hand"
            script = script.replace(f"--submission-id {run_id}", f"--submission-id {hand_id}")
            path = root / "submit.sh"
            path.write_text(script)
            env = os.environ | {
                "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",
                "PYTHONPATH": str(ROOT),
                "RAY_ADDRESS": address,
                "RAY_AUTH_MODE": "token",
                "RAY_AUTH_TOKEN": token,
            }
            since = time.monotonic()
            with open(root / "submit.log", "wb") as out:
                submit = subprocess.Popen(["bash", str(path)], env=env, stdout=out, stderr=out)
                hand = follow(ray, hand_id, since)
                submit.wait(120)
            report.add("by hand", json.dumps(hand | {"per_step": None}))
            ray.close()
    finally:
        service.stop()
        lock.close()
    rows = []
    for name, got in (("by hand (ray job submit)", hand), ("through the service", served)):
        steps = got["per_step"]
        rows.append(
            [
                name,
                got["status"],
                f"{got['startup']:.1f}" if got["startup"] is not None else "-",
                f"{statistics.mean(steps):.2f}" if steps else "-",
                " ".join(f"{s:.2f}" for s in steps),
                f"{got['total']:.0f}",
            ]
        )
    step_ratio = (
        statistics.mean(served["per_step"]) / statistics.mean(hand["per_step"])
        if served["per_step"] and hand["per_step"]
        else float("nan")
    )
    more = (served["startup"] or float("nan")) - (hand["startup"] or float("nan"))
    print("\n### verl cpu-smoke: by hand vs through the service, one Ray head\n")
    print(
        table(
            [
                "submitted",
                "status",
                "start-up s (submit -> first step line)",
                "per step s (mean)",
                "per step s (verl's timing_s/step)",
                "submit -> end s",
            ],
            rows,
        )
    )
    report.add("per step, service / hand", f"{step_ratio:.3f} (goal <= 1.02)")
    report.add("start-up, service - hand", f"{more:+.1f} s (goal <= +5 s)")
    report.print()
    print(f"(logs kept in {root})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="no verl: the two commands compared")
    report = Report("verl: the service's overhead against a hand-submitted job")
    if parser.parse_args().quick:
        quick(report)
    else:
        full(report)


if __name__ == "__main__":
    main()
