"""The service's modules import each other without a cycle (a static graph of module-level
imports: what runs when a module is first imported; imports inside functions are deferred)."""

from __future__ import annotations

import ast
import subprocess
import sys
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
    # A module's own packages are loaded before it, whatever it imports: no edge of the graph.
    parts = name.split(".")
    out -= {".".join(parts[:i]) for i in range(1, len(parts) + 1)}
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


# The layers, top down: the app's assembly (these modules and ``api/``), ``api/`` (HTTP: parse,
# authorise, call, answer), ``operations/`` (what the API does, without HTTP), and below them the
# rest (store/, scheduling/, recipes/, ...). A module imports only from its layer or below.
API = "service.api"
OPERATIONS = "service.operations"
ASSEMBLY = {"service.app", "service.dashboard", "service.telemetry"}
WEB = ("fastapi", "starlette")


def _in(module: str, layer: str) -> bool:
    return module == layer or module.startswith(layer + ".")


def _layer(module: str) -> int:
    if module in ASSEMBLY:
        return 3
    if _in(module, API):
        return 2
    if _in(module, OPERATIONS):
        return 1
    return 0


def upward(g: dict[str, set[str]]) -> set[tuple[str, str]]:
    """Imports of a module of a higher layer (packages, ``service`` itself, are no layer)."""
    return {
        (module, dep)
        for module, deps in g.items()
        for dep in deps
        if dep not in ("service", "jobs") and _layer(dep) > _layer(module)
    }


def test_operations_sit_between_the_routes_and_the_store() -> None:
    g = graph()
    assert upward(g) == set()
    assert {dep for dep in g["service.api.runs"] if _in(dep, OPERATIONS)}
    assert "service.store.lifecycle" in g["service.operations.accept"]


def test_the_layer_check_finds_an_upward_import() -> None:
    g = {"service.operations.x": {"service.api.deps"}, "service.store.y": {"service.app"}}
    assert upward(g) == {
        ("service.operations.x", "service.api.deps"),
        ("service.store.y", "service.app"),
    }


def web_importers() -> set[str]:
    """Modules that import FastAPI or Starlette when first imported."""
    found = set()
    for name, path in modules().items():
        for node in _top_level(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                targets = [node.module or ""]
            else:
                continue
            if any(t.split(".")[0] in WEB for t in targets):
                found.add(name)
    return found


def test_only_the_http_layer_imports_the_web_framework() -> None:
    importers = web_importers()
    assert "service.api.runs" in importers
    assert {m for m in importers if _layer(m) < 2} == set()


def test_the_client_loads_no_server() -> None:
    """``service.client`` (and the answers' models it reads into) runs on a laptop: no web
    framework, database or Ray is imported with it."""
    code = (
        "import sys, service.client; "
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'fastapi', 'starlette', "
        "'sqlalchemy', 'ray', 'uvicorn'}))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=HERE, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]"
