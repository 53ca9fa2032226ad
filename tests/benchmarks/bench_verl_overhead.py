"""The service's overhead on a real verl run: the same cpu-smoke job (verl's own fully async
trainer on CPU) submitted by hand, with ``ray job submit`` from the script the service exports
(``GET /runs/{id}/script``), and through the service (``POST /runs``), one after the other on
the same embedded Ray head, after a warm-up run whose figures are not counted (the first run on
a host pays for its cold caches), in alternating order over ``--rounds`` pairs. Per job: start-up
(submit to verl's first ``step:`` line in Ray's job log, both read the same way, every 0.5 s)
and per-step time (verl's own ``timing_s/step``, the median over the steps), and the ratios.
Goal: per-step within 2 %, start-up at most 5 s more.

    PYTHONPATH=$PWD python -m tests.benchmarks.bench_verl_overhead [--quick] [--rounds N]

The full run takes the host's verl lock (1 + 2N verl runs of ``--syncs`` steps, 8 by default
so that the per-step figure is more than the preset's 3 steps give; about 2 minutes each on a
quiet host).
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


def summary(got: dict[str, Any]) -> str:
    startup = f"{got['startup']:.1f} s" if got["startup"] is not None else "no step line"
    return f"{got['status']}, start-up {startup}, submit -> end {got['total']:.0f} s"


def by_hand(ray: RayJobs, root: Path, script: str, run_id: str, name: str) -> dict[str, Any]:
    """Submit the exported ``script`` of ``run_id`` with ``ray job submit``, as job ``name``,
    and follow it. The checkpoint dir the script names is set aside first: verl would resume
    from it."""
    checkpoints = root / "checkpoints" / run_id
    if checkpoints.exists():
        checkpoints.rename(checkpoints.with_name(f"{run_id}.{time.monotonic_ns()}"))
    path = root / f"{name}.sh"
    path.write_text(script.replace(f"--submission-id {run_id}", f"--submission-id {name}"))
    env = os.environ | {
        "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",
        "PYTHONPATH": str(ROOT),
        "RAY_ADDRESS": ray.address,
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN": ray.token or "",
    }
    since = time.monotonic()
    with open(root / f"{name}.log", "wb") as out:
        submit = subprocess.Popen(["bash", str(path)], env=env, stdout=out, stderr=out)
        got = follow(ray, name, since)
        submit.wait(120)
    return got


def served(ray: RayJobs, http: httpx.Client, syncs: int) -> tuple[str, dict[str, Any]]:
    """``POST /runs`` the cpu-smoke run (``syncs`` steps of 4 prompts) and follow its job; its
    id and what was measured."""
    since = time.monotonic()
    spec = SMOKE | {"rollout": {"total_rollout_steps": 4 * syncs}}
    run_id = http.post("/runs", json=spec).json()["id"]
    return run_id, follow(ray, run_id, since)


def full(report: Report, rounds: int, syncs: int) -> None:
    """A warm-up run through the service (it warms the host's caches: the job user's pip,
    torch and vLLM caches, the page cache; its figures are not counted), then ``rounds``
    pairs, the service first in odd rounds and the hand run first in even ones."""
    from tests.verl_run import LOCK, start_service

    lock = LOCK.open("w")
    print(f"waiting for the verl lock {LOCK} ...", flush=True)
    fcntl.flock(lock, fcntl.LOCK_EX)
    root, service = start_service("rlrun-verl-bench-")
    got: dict[str, list[dict[str, Any]]] = {"hand": [], "service": []}
    try:
        with httpx.Client(base_url=service.url, timeout=60) as http:
            address = f"http://127.0.0.1:{service.env['RLRUN_LOCAL_DASHBOARD_PORT']}"
            token = (root / "r" / "ray-token").read_text().strip()
            ray = RayJobs(address, token)
            warm_id, warm = served(ray, http, syncs)
            report.add("warm-up (through the service, not counted)", summary(warm))
            script = http.get(f"/runs/{warm_id}/script").text
            for n in range(1, rounds + 1):
                order = ["service", "hand"] if n % 2 else ["hand", "service"]
                for which in order:
                    if which == "service":
                        got["service"].append(served(ray, http, syncs)[1])
                    else:
                        got["hand"].append(
                            by_hand(ray, root, script, warm_id, f"{warm_id}-hand{n}")
                        )
                    print(f"round {n}, {which}: {summary(got[which][-1])}", flush=True)
            ray.close()
    finally:
        service.stop()
        lock.close()
    rows = []
    for n in range(rounds):
        for name, which in (
            ("by hand (ray job submit)", "hand"),
            ("through the service", "service"),
        ):
            one = got[which][n]
            steps = one["per_step"]
            rows.append(
                [
                    str(n + 1),
                    name,
                    one["status"],
                    f"{one['startup']:.1f}" if one["startup"] is not None else "-",
                    f"{statistics.median(steps):.2f}" if steps else "-",
                    " ".join(f"{s:.2f}" for s in steps),
                    f"{one['total']:.0f}",
                ]
            )

    def median_step(which: str) -> float:
        steps = [s for one in got[which] for s in one["per_step"]]
        return statistics.median(steps) if steps else float("nan")

    def mean_startup(which: str) -> float:
        ups = [one["startup"] for one in got[which] if one["startup"] is not None]
        return statistics.mean(ups) if ups else float("nan")

    print("\n### verl cpu-smoke: by hand vs through the service, one Ray head\n")
    print(
        table(
            [
                "round",
                "submitted",
                "status",
                "start-up s (submit -> first step line)",
                "per step s (median)",
                "per step s (verl's timing_s/step)",
                "submit -> end s",
            ],
            rows,
        )
    )
    report.add(
        "per step (median), service / hand",
        f"{median_step('service') / median_step('hand'):.3f} (goal <= 1.02)",
    )
    report.add(
        "start-up (mean), service - hand",
        f"{mean_startup('service') - mean_startup('hand'):+.1f} s (goal <= +5 s)",
    )
    report.print()
    print(f"(logs kept in {root})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="no verl: the two commands compared")
    parser.add_argument("--rounds", type=int, default=1, help="pairs of runs after the warm-up")
    parser.add_argument("--syncs", type=int, default=8, help="steps of each run (the preset: 3)")
    report = Report("verl: the service's overhead against a hand-submitted job")
    args = parser.parse_args()
    if args.quick:
        quick(report)
    else:
        full(report, args.rounds, args.syncs)


if __name__ == "__main__":
    main()
