"""How long validating one verl-fully-async spec takes: cold (first compose of verl's config)
and warm (per spec, every run a new id and checkpoint dir), against a full Hydra compose; and
how often Hydra's parser sees each override string in one accept (once: the pipeline parses
before its stages, which take the parsed overrides).

Run: PYTHONPATH=. python tests/benchmarks/bench_verl_validation.py [--quick]

``--quick``: 20 warm specs rather than 300 (what CI runs).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from service.recipes.base import LaunchContext
from service.recipes.registry import default_registry
from service.recipes.verl import hydra_check
from service.settings import Settings
from tests.benchmarks.report import Report

EXAMPLES = Path(__file__).parent.parent / "data" / "verl_examples"
PRESET = {"recipe": "verl-fully-async", "preset": "geo3k-qwen3vl-8b-npu"}


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f} ms"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="small, in seconds (what CI runs)")
    specs = 20 if parser.parse_args().quick else 300
    report = Report("verl spec validation")
    registry = default_registry((), Settings())
    bodies: list[dict[str, Any]] = [PRESET]
    bodies += [json.loads(p.read_text())["spec"] for p in sorted(EXAMPLES.glob("*.json"))]
    start = time.perf_counter()
    registry.build(PRESET, LaunchContext("cold"))
    report.add("cold (first spec, composes verl's base config)", ms(time.perf_counter() - start))
    for body in bodies[1:]:
        registry.build(body, LaunchContext("warmup"))
    samples: list[float] = []
    for i in range(specs):
        body = bodies[i % len(bodies)] | {"name": f"run-{i}"}
        start = time.perf_counter()
        registry.build(body, LaunchContext(f"run-{i:05d}"))
        samples.append(time.perf_counter() - start)
    samples.sort()
    report.add(
        f"warm, per spec over {len(samples)} specs ({len(bodies)} shapes, unique run ids)",
        f"p50 {ms(statistics.median(samples))}, p99 {ms(samples[int(len(samples) * 0.99)])}, "
        f"max {ms(samples[-1])}",
    )
    argv = registry.build(PRESET, LaunchContext("hydra"))[1].argv
    # The Hydra overrides: what follows verl's entry point and its --config-name.
    argv = argv[next(i for i, a in enumerate(argv) if a.startswith("--config-name")) + 1 :]
    start = time.perf_counter()
    hydra_check._compose("fully_async_ppo_trainer", tuple(argv))
    report.add("one full Hydra compose of the preset", ms(time.perf_counter() - start))
    report.add("Hydra parser calls per override string, per accept", parses_per_override(registry))
    report.print()


def parses_per_override(registry: Any) -> str:
    real, counts = hydra_check.parse, Counter[str]()

    def counted(text: str) -> Any:
        counts[text] += 1
        return real(text)

    modules = [
        m
        for name, m in list(sys.modules.items())
        if name.startswith("service.recipes.verl") and getattr(m, "parse", None) is real
    ]
    for m in modules:
        m.parse = counted  # type: ignore[attr-defined]
    try:
        argv = registry.build(PRESET, LaunchContext("parses"))[1].argv
    finally:
        for m in modules:
            m.parse = real  # type: ignore[attr-defined]
    texts = argv[argv.index("--") + 6 :]  # verl's Hydra overrides, after its --config-name
    calls = [counts[t] for t in texts]
    return f"{statistics.mean(calls):.2f} (max {max(calls)}, {len(texts)} overrides)"


if __name__ == "__main__":
    main()
