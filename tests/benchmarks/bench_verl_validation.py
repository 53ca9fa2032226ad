"""How long validating one verl-fully-async spec takes: cold (first compose of verl's config)
and warm (per spec, every run a new id and checkpoint dir), against a full Hydra compose.

Run: PYTHONPATH=. python tests/benchmarks/bench_verl_validation.py
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path
from typing import Any

from service.recipes.base import LaunchContext
from service.recipes.registry import default_registry
from service.recipes.verl import hydra_check
from service.settings import Settings

EXAMPLES = Path(__file__).parent.parent / "data" / "verl_examples"
PRESET = {"recipe": "verl-fully-async", "preset": "geo3k-qwen3vl-8b-npu"}


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f} ms"


def main() -> None:
    registry = default_registry("", Settings())
    bodies: list[dict[str, Any]] = [PRESET]
    bodies += [json.loads(p.read_text())["spec"] for p in sorted(EXAMPLES.glob("*.json"))]
    start = time.perf_counter()
    registry.build(PRESET, LaunchContext("cold"))
    print(f"cold (first spec, composes verl's base config): {ms(time.perf_counter() - start)}")
    for body in bodies[1:]:
        registry.build(body, LaunchContext("warmup"))
    samples: list[float] = []
    for i in range(300):
        body = bodies[i % len(bodies)] | {"name": f"run-{i}"}
        start = time.perf_counter()
        registry.build(body, LaunchContext(f"run-{i:05d}"))
        samples.append(time.perf_counter() - start)
    samples.sort()
    print(
        f"warm, per spec over {len(samples)} specs ({len(bodies)} shapes, unique run ids): "
        f"p50 {ms(statistics.median(samples))}, p99 {ms(samples[int(len(samples) * 0.99)])}, "
        f"max {ms(samples[-1])}"
    )
    argv = registry.build(PRESET, LaunchContext("hydra"))[1].argv[5:]
    start = time.perf_counter()
    hydra_check._compose("fully_async_ppo_trainer", tuple(argv))
    print(
        f"for comparison, one full Hydra compose of the preset: {ms(time.perf_counter() - start)}"
    )


if __name__ == "__main__":
    main()
