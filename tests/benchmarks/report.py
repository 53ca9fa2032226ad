"""What every benchmark shares: its figures printed as a Markdown table at the end (what
``tests/test_benchmarks.py`` looks for), and the Ray head its Ray parts run on.

A figure is printed as it is measured too (``name: figure``), so a long run shows progress.
``RLRUN_BENCH_RAY_ADDRESS`` names a running Ray head (the dashboard address) for every
benchmark to share: the quick runs in CI use the pytest session's cluster rather than each
starting its own (a head takes seconds to start, more on a loaded machine).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from service.cluster.local_ray import LocalRayCluster
from tests.conftest import RAY_TOKENS

SHARED_RAY = "RLRUN_BENCH_RAY_ADDRESS"
SHARED_RAY_TOKEN = "RLRUN_BENCH_RAY_TOKEN"


def runs_from_args(doc: str, runs: int, quick: str) -> tuple[int, bool]:
    """How many runs a benchmark of real runs makes: ``--runs`` (default ``runs``), or one with
    ``--quick``; and whether it is quick."""
    parser = argparse.ArgumentParser(description=doc.split("\n")[0])
    parser.add_argument("--runs", type=int, default=runs)
    parser.add_argument("--quick", action="store_true", help=quick)
    args = parser.parse_args()
    return (1 if args.quick else int(args.runs)), bool(args.quick)


def table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A Markdown table: a header row, its rule, a row per item."""
    lines = [header, ["---"] * len(header), *rows]
    return "\n".join("| " + " | ".join(str(cell) for cell in line) + " |" for line in lines)


class Report:
    """A benchmark's figures: each printed as it comes, all of them as a table by ``print``."""

    def __init__(self, title: str) -> None:
        self.title = title
        self.rows: list[tuple[str, str]] = []

    def add(self, what: str, figure: str) -> None:
        print(f"{what}: {figure}", flush=True)
        self.rows.append((what, figure))

    def skip(self, what: str, why: str) -> None:
        """A part left out (``--quick``, a peer not installed): shown in the table as such."""
        self.add(what, f"not measured: {why}")

    def print(self) -> None:
        print(f"\n### {self.title}\n")
        print(table(["measure", "figure"], self.rows), flush=True)


@contextmanager
def ray_head(npus_per_node: list[int], cpus: int, port: int | None = None) -> Iterator[str]:
    """The dashboard address of a Ray head: the shared one ``RLRUN_BENCH_RAY_ADDRESS`` (with
    ``RLRUN_BENCH_RAY_TOKEN``) names (left running), else a local head started here with these
    nodes (stopped after). Its token is in ``tests.conftest.RAY_TOKENS`` for the settings,
    clients and services the benchmark makes."""
    shared = os.environ.get(SHARED_RAY)
    if shared:
        if token := os.environ.get(SHARED_RAY_TOKEN):
            RAY_TOKENS[shared] = token
        yield shared
        return
    dashboard = None if port is None else port + 2000
    cluster = LocalRayCluster(
        npus_per_node, cpus_per_node=cpus, port=port, dashboard_port=dashboard
    ).start()
    RAY_TOKENS[cluster.address] = cluster.token
    try:
        yield cluster.address
    finally:
        cluster.cleanup()


def ray_headers(address: str) -> dict[str, str]:
    """What authenticates a plain HTTP call to the head at ``address``."""
    token = RAY_TOKENS.get(address)
    return {"Authorization": f"Bearer {token}"} if token else {}
