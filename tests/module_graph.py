"""The service's modules and their imports, on the floors data flows through.

A module stands on a floor (``FLOORS``, bottom first) and imports only from its floor or below,
whether the import runs when the module is loaded or later (inside a function, or for the type
checker alone): an import of a higher floor ("back up") is allowed only where a comment on its
line, or the line above, says why (``# up: ...``). No import circle, counting every import.
``tests/test_module_graph.py`` keeps these rules; ``docs/design/how-it-works.md`` shows
``diagram()``.

    python -m tests.module_graph        # floors, back-up imports and circles
    python -m tests.module_graph --diagram
"""

from __future__ import annotations

import argparse
import ast
import functools
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOTS = ("service", "jobs")
HERE = Path(__file__).resolve().parent.parent

# Bottom first: (floor, what stands on it, the modules and packages on it). A module is on the
# floor of the longest name here that it is or is inside.
FLOORS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    (
        "words",
        "vocabulary any floor may name: no decision, no I/O",
        (
            "jobs",
            "service.backoff",
            "service.clock",
            "service.errors",
            "service.ids",
            "service.metrics.keys",
            "service.recovery.attempts",
            "service.retry_policy",
            "service.scheduling.priority",
            "service.store.status",
        ),
    ),
    (
        "shapes",
        "settings, the answers' models, the client: no domain module",
        ("service.cli_tables", "service.client", "service.settings", "service.wire"),
    ),
    ("store", "the database: runs, events, tokens, audit", ("service.principal", "service.store")),
    (
        "plans",
        "what a spec asks, where it fits, what runs used",
        ("service.recipes", "service.scheduling", "service.team_secrets", "service.usage"),
    ),
    ("cluster", "Ray: the one client, the clusters, the inventory read", ("service.cluster",)),
    (
        "signals",
        "what runs tell: logs, metrics, health, webhooks",
        ("service.metrics", "service.notify"),
    ),
    ("recovery", "why a run ended, and its next attempt", ("service.recovery",)),
    (
        "loops",
        "the background loops, and who listens to the lifecycle",
        ("service.listeners", "service.loops"),
    ),
    ("operations", "what the API does, without HTTP", ("service.operations",)),
    ("api", "HTTP: parse, authorise, call, answer", ("service.api",)),
    (
        "app",
        "the app's assembly",
        ("service.app", "service.dashboard", "service.shutdown", "service.telemetry"),
    ),
    ("cli", "the rlrun command", ("service.cli",)),
)
UP = "# up:"


def modules() -> dict[str, Path]:
    found = {}
    for root in ROOTS:
        for path in (HERE / root).rglob("*.py"):
            parts = path.relative_to(HERE).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


def _top_level(tree: ast.Module) -> Iterator[ast.stmt]:
    """Statements run at import: the module body, into ``if``/``try`` but not ``TYPE_CHECKING``."""
    todo = list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, ast.If):
            if "TYPE_CHECKING" not in ast.unparse(node.test):
                todo += node.body + node.orelse
        elif isinstance(node, ast.Try):
            todo += node.body + node.orelse + node.finalbody
            todo += [s for h in node.handlers for s in h.body]
        else:
            yield node


@dataclass(frozen=True)
class Import:
    module: str
    target: str
    line: int
    at_load: bool  # run when the module is first imported (else in a function, or for types)
    said_why: bool  # a ``# up:`` comment on its line or the line above


def imports_of(name: str, path: Path, known: dict[str, Path]) -> list[Import]:
    """Every project module ``name`` imports (the packages on the way included), where."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    text = path.read_text()
    lines = text.splitlines()
    tree = ast.parse(text)
    at_load = {id(n) for n in _top_level(tree)}
    own = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 2)}
    out: list[Import] = []
    for node in ast.walk(tree):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                keep = len(package.split(".")) - node.level + 1
                base = ".".join([*package.split(".")[:keep], base]).strip(".")
            targets = [
                f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names
            ]
        else:
            continue
        near = " ".join(lines[max(0, node.lineno - 2) : node.end_lineno or node.lineno])
        deps = set()
        for target in targets:
            parts = target.split(".")
            # The target, and the packages on the way that run code of their own when loaded
            # (an ``__init__`` that only names its package is no edge), but not the module's
            # own packages: they are loaded before it, whatever it imports.
            way = {".".join(parts[:i]) for i in range(1, len(parts))}
            deps |= {target} | {p for p in way if p in known and _runs_code(known[p])}
        for dep in sorted((deps & known.keys()) - own):
            out.append(Import(name, dep, node.lineno, id(node) in at_load, UP in near))
    return out


@functools.cache
def _runs_code(path: Path) -> bool:
    """Whether a package's ``__init__`` imports anything (else it only names its package)."""
    tree = ast.parse(path.read_text())
    return any(isinstance(n, ast.Import | ast.ImportFrom) for n in ast.walk(tree))


@functools.cache
def all_imports() -> tuple[Import, ...]:
    known = modules()
    return tuple(i for name, path in sorted(known.items()) for i in imports_of(name, path, known))


def graph(at_load_only: bool = True) -> dict[str, set[str]]:
    """Module -> the modules it imports (when first imported, or at all)."""
    g: dict[str, set[str]] = {name: set() for name in modules()}
    for i in all_imports():
        if i.at_load or not at_load_only:
            g[i.module].add(i.target)
    return g


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(g[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return found


def floor_of(module: str) -> int | None:
    """The index of ``module``'s floor in ``FLOORS`` (None: a root package, or on none)."""
    best: tuple[int, int] | None = None
    for i, (_, _, names) in enumerate(FLOORS):
        for n in names:
            if (module == n or module.startswith(n + ".")) and (best is None or len(n) > best[1]):
                best = (i, len(n))
    return None if best is None else best[0]


def back_up(imports: tuple[Import, ...] | list[Import]) -> list[Import]:
    """Imports of a module on a higher floor than the importer's, none said why."""
    out = []
    for i in imports:
        mine, theirs = floor_of(i.module), floor_of(i.target)
        if mine is not None and theirs is not None and theirs > mine and not i.said_why:
            out.append(i)
    return out


def depth(g: dict[str, set[str]]) -> int:
    """How many floors the imports run at load stack up to (the longest chain of modules, a
    root package not counted): what the import graph alone would make of the floors."""

    @functools.cache
    def level(m: str) -> int:
        below = [level(d) for d in g[m] if d not in ROOTS]
        return 1 + max(below, default=0)

    return max((level(m) for m in g if m not in ROOTS), default=0)


def diagram() -> str:
    """The floors, top down, as ``docs/design/how-it-works.md`` shows them."""
    width = max(len(name) for name, _, _ in FLOORS)
    rows = []
    for name, what, members in reversed(FLOORS):
        shown = ", ".join(m.removeprefix("service.") for m in members)
        rows.append(f"{name:>{width}} | {shown}\n{'':>{width}} |   {what}")
    return f"\n{'':>{width}} |\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--diagram", action="store_true", help="the floors as the docs show them")
    args = parser.parse_args()
    if args.diagram:
        print(diagram())
        return
    found = modules()
    counts = [0] * len(FLOORS)
    nowhere = []
    for m in found:
        f = floor_of(m)
        if f is None:
            nowhere += [] if m in ROOTS else [m]
        else:
            counts[f] += 1
    print(
        f"floors: {len(FLOORS)} declared, bottom first; the imports at load stack "
        f"{depth(graph())} modules deep"
    )
    for (name, _, _), n in zip(FLOORS, counts, strict=True):
        print(f"  {name:<11} {n:>3} modules")
    if nowhere:
        print(f"  on no floor: {', '.join(sorted(nowhere))}")
    every = all_imports()
    ups = back_up(every)
    said = [
        i
        for i in every
        if i.said_why
        and floor_of(i.target)
        and floor_of(i.module) is not None
        and (floor_of(i.target) or 0) > (floor_of(i.module) or 0)
    ]
    print(f"back-up imports: {len(ups)} (and {len(said)} said why)")
    for i in ups:
        print(
            f"  {i.module}:{i.line} -> {i.target} "
            f"({FLOORS[floor_of(i.module) or 0][0]} -> {FLOORS[floor_of(i.target) or 0][0]})"
        )
    circles = cycles(graph(at_load_only=False))
    print(f"circles: {len(circles)} (every import counted)")
    for c in circles:
        print(f"  {' <-> '.join(c)}")


if __name__ == "__main__":
    main()
