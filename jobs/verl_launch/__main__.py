"""``python3 -m jobs.verl_launch --plan <json> -- <verl argv>``: preflight, then exec verl.

A run that names secrets first redeems its grant (``jobs.grant``): the values go into this
process's environment, which verl inherits across the handover, and to every worker of the job.
A grant that cannot be redeemed ends the job before anything else runs.

One Ray task is pinned to each alive node with CPUs or the run's accelerator
(``NodeAffinitySchedulingStrategy``, no CPU held) and runs ``checks.check_node``; the report is
printed as one line. Any failure (or a node that does not answer in time) ends the job before
verl starts; otherwise the launcher leaves Ray and replaces itself with verl's own command, argv
unchanged (on a later attempt, with the resume overrides ``resume`` decides). A watcher of the
run's checkpoint dir (``saves``) goes on beside verl and says each complete checkpoint.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from collections.abc import Callable
from typing import Any

from jobs import grant, resume
from jobs.verl_launch import EXIT_FAILED, HANDOVER, PREFIX, Plan, Report, saves
from jobs.verl_launch import resume as verl_resume
from jobs.verl_launch.checks import check_node


def split_argv(argv: list[str]) -> tuple[Plan, list[str]]:
    if len(argv) < 4 or argv[0] != "--plan" or argv[2] != "--":
        raise SystemExit("usage: python3 -m jobs.verl_launch --plan <json> -- <command ...>")
    plan: Plan = json.loads(argv[1])
    return plan, argv[3:]


def preflight(plan: Plan, connected_hook: Callable[[], None] | None = None) -> Report:
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    started = time.monotonic()
    ray.init(logging_level=logging.WARNING, log_to_driver=False)
    connected = time.monotonic()
    try:
        if connected_hook is not None:
            connected_hook()
        accelerator = plan.get("accelerator", "NPU")
        # Every node that can hold any part of the run: verl's CPU-only actors read data too,
        # so nodes with CPUs count; a node with neither CPUs nor accelerators holds nothing.
        nodes = [
            n
            for n in ray.nodes()  # type: ignore[no-untyped-call]
            if n.get("Alive")
            and any(n.get("Resources", {}).get(r, 0) > 0 for r in ("CPU", accelerator))
        ]
        task = ray.remote(num_cpus=0, max_retries=0)(check_node)
        pending = {
            n["NodeID"]: task.options(
                scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)
            ).remote(plan, float(n.get("Resources", {}).get(accelerator, 0)))
            for n in nodes
        }
        timeout = float(plan.get("timeout_s", 60.0))
        ready, _ = ray.wait(list(pending.values()), num_returns=len(pending), timeout=timeout)
        report_nodes = []
        for n in nodes:
            ref = pending[n["NodeID"]]
            if ref in ready:
                try:
                    checks = ray.get(ref)
                except Exception as exc:  # the check itself crashed on that node
                    checks = [_failed("node", "preflight", f"the check failed: {exc!r}"[:300])]
            else:
                checks = [_failed("node", "preflight", f"did not answer within {timeout:g}s")]
            report_nodes.append(
                {
                    "node": n.get("NodeManagerAddress", "?"),
                    "node_id": n["NodeID"],
                    "ok": all(c["ok"] for c in checks),
                    "checks": checks,
                }
            )
    finally:
        ray.shutdown()
    return {
        "ok": all(n["ok"] for n in report_nodes),
        "seconds": round(time.monotonic() - started, 3),
        "connect_seconds": round(connected - started, 3),
        "nodes": report_nodes,
    }


def _failed(check: str, key: str, reason: str) -> dict[str, Any]:
    return {"check": check, "key": key, "target": "", "ok": False, "reason": reason}


def first_failure(report: Report) -> str:
    for node in report["nodes"]:
        for c in node["checks"]:
            if not c["ok"]:
                what = f"{c['key']} {c['target']}".strip()
                if c["check"] == "package":
                    what = c["key"]
                elif c["check"] == "pair":
                    what = c["target"]
                return f"node {node['node']} ({node['node_id'][:12]}): {what} {c['reason']}"
    return "no node answered"


def main(argv: list[str]) -> None:
    plan, command = split_argv(argv)
    try:
        values, submission_id = grant.redeem()
    except grant.GrantRefused as exc:
        print(f"rlrun launch failed: {exc}", file=sys.stderr, flush=True)
        sys.exit(EXIT_FAILED)
    report = preflight(plan, lambda: grant.share(values, submission_id))
    print(PREFIX + json.dumps(report, separators=(",", ":")), flush=True)
    if not report["ok"] or not report["nodes"]:
        print(f"rlrun preflight failed on {first_failure(report)}", file=sys.stderr, flush=True)
        sys.exit(EXIT_FAILED)
    if os.environ.get(resume.ATTEMPT_ENV) or resume.wanted() == "scratch":
        # A later attempt: from the newest complete checkpoint, decided here where it is.
        overrides, step, path = verl_resume.decide(
            verl_resume.checkpoint_dir(plan), resume.wanted()
        )
        command = verl_resume.with_overrides(command, overrides)
        resume.announce(step, path)
    root = verl_resume.checkpoint_dir(plan)
    if root is not None:
        saves.start(root)  # says each complete checkpoint in the log while verl runs
    print(HANDOVER + json.dumps(command), flush=True)
    os.execvp(command[0], command)  # noqa: S606 - the handover: verl replaces the launcher


if __name__ == "__main__":
    main(sys.argv[1:])
