"""Dry-run latency through the API: the first dry run of each verl spec and the same dry run
repeated (each repeat gets a new run id, as every request does).

    PYTHONPATH=. python -m tests.benchmarks.bench_dry_run [--quick] [--repeats 20]

The specs: the geo3k preset, the preset with a config-group override (which changes verl's
defaults list: only a full Hydra composition applies it) and the verl example specs in
tests/data/verl_examples (``--quick``: the first two).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

from service.app import create_app
from service.settings import Settings
from tests.benchmarks import report

EXAMPLES = Path(__file__).parent.parent / "data" / "verl_examples"
PRESET = {"recipe": "verl-fully-async", "preset": "geo3k-qwen3vl-8b-npu"}


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


def specs(quick: bool) -> dict[str, dict[str, Any]]:
    # A config-group override: only Hydra's own composition applies it (the costly path).
    group = PRESET | {"overrides": ["model_engine=dp"]}
    out = {"geo3k preset": PRESET, "geo3k preset, model_engine=dp": group}
    for path in sorted(EXAMPLES.glob("*.json")):
        out[path.stem] = json.loads(path.read_text())["spec"]
    if quick:
        out = {"geo3k preset": PRESET, "geo3k preset, model_engine=dp": group}
    return out


def dry_run(client: TestClient, body: dict[str, Any]) -> float:
    started = time.perf_counter()
    resp = client.post("/runs", params={"dry_run": True}, json=body)
    elapsed = time.perf_counter() - started
    assert resp.status_code == 200, resp.text
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="two specs, five repeats")
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    repeats = 5 if args.quick else args.repeats
    with tempfile.TemporaryDirectory() as tmp:
        settings = Settings(
            database_url=f"sqlite:///{tmp}/bench.db",
            ray_address="http://127.0.0.1:9",  # no cluster: the plan says so, nothing waits
            run_loops=False,
        )
        rows = []
        with TestClient(create_app(settings), base_url="http://127.0.0.1") as client:
            for name, body in specs(args.quick).items():
                first = dry_run(client, body)
                again = sorted(dry_run(client, body) for _ in range(repeats))
                rows.append([name, ms(first), ms(statistics.median(again)), ms(again[-1])])
                print(f"{name}: first {rows[-1][1]}, repeated p50 {rows[-1][2]}", flush=True)
    print(f"\n### Dry runs (repeated x{repeats})\n")
    print(report.table(["spec", "first", "repeated p50", "repeated max"], rows))


if __name__ == "__main__":
    main()
