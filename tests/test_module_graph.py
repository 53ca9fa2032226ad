"""The service's modules import each other without a cycle (a static graph of module-level
imports: what runs when a module is first imported; imports inside functions are deferred)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOTS = ("service", "jobs")
HERE = Path(__file__).resolve().parent.parent


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


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The project modules ``name`` runs when first imported (packages of each included)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in _top_level(ast.parse(path.read_text())):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(
                    [*package.split(".")[: len(package.split(".")) - node.level + 1], base]
                ).strip(".")
            targets = [
                f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names
            ]
        for target in targets:
            parts = target.split(".")
            out |= {".".join(parts[:i]) for i in range(1, len(parts) + 1)} & known.keys()
    out.discard(name)
    return out


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
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

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports(name, path, known) for name, path in known.items()}


def test_no_module_imports_itself_back() -> None:
    assert cycles(graph()) == []


def test_the_check_finds_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_shapes_and_priorities_load_no_recipe() -> None:
    g = graph()
    seen, todo = set(), ["service.scheduling.shape", "service.scheduling.priority"]
    while todo:
        for dep in g[todo.pop()] - seen:
            seen.add(dep)
            todo.append(dep)
    assert not {m for m in seen if m.startswith("service.recipes")}


def test_jobs_never_import_the_service() -> None:
    crossing = {
        (module, dep)
        for module, deps in graph().items()
        if module.startswith("jobs")
        for dep in deps
        if dep.startswith("service")
    }
    assert not crossing
