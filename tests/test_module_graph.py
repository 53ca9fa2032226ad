"""The service's modules import each other without a circle, each from its floor or below
(``tests/module_graph.py``: the floors, and the graph read from the code), and the rules of the
architecture hold: settings and answers know no domain module, scheduling no cluster client, the
store nothing above it, the web framework only the HTTP layer."""

from __future__ import annotations

import ast
import re
import subprocess
import sys

from tests.module_graph import (
    FLOORS,
    HERE,
    ROOTS,
    Import,
    _top_level,
    all_imports,
    back_up,
    cycles,
    diagram,
    floor_of,
    graph,
    modules,
)


def test_no_module_imports_itself_back() -> None:
    assert cycles(graph()) == []


def test_no_circle_even_through_imports_made_later_or_for_types() -> None:
    assert cycles(graph(at_load_only=False)) == []


def test_every_module_stands_on_a_floor() -> None:
    assert {m for m in modules() if m not in ROOTS and floor_of(m) is None} == set()


def test_no_module_imports_one_on_a_higher_floor_unless_it_says_why() -> None:
    ups = back_up(all_imports())
    assert [f"{i.module}:{i.line} -> {i.target}" for i in ups] == []


def test_the_floor_check_finds_an_import_back_up_and_reads_its_reason() -> None:
    up = Import("service.store.runs", "service.api.deps", 3, at_load=False, said_why=False)
    said = Import("service.store.runs", "service.api.deps", 3, at_load=False, said_why=True)
    down = Import("service.api.deps", "service.store.runs", 3, at_load=True, said_why=False)
    assert back_up([up, said, down]) == [up]


def _reach(start: str, at_load_only: bool = False) -> set[str]:
    """Every module ``start`` (a module or a package prefix) imports, directly or not."""
    g = graph(at_load_only)
    todo = [m for m in g if m == start or m.startswith(start + ".")]
    seen: set[str] = set()
    while todo:
        for dep in g[todo.pop()] - seen:
            seen.add(dep)
            todo.append(dep)
    return seen


def _floor(name: str) -> int:
    return next(i for i, (n, _, _) in enumerate(FLOORS) if n == name)


def test_settings_and_the_answers_models_know_no_domain_module() -> None:
    for start in ("service.settings", "service.wire", "service.client"):
        reached = {m for m in _reach(start) if m not in ROOTS}
        assert {m for m in reached if (floor_of(m) or 0) > _floor("shapes")} == set(), start


def test_scheduling_imports_no_cluster_client() -> None:
    reached = _reach("service.scheduling")
    assert {
        m for m in reached if m == "service.cluster" or m.startswith("service.cluster.")
    } == set()


def test_the_store_imports_nothing_above_it() -> None:
    reached = {m for m in _reach("service.store") if m not in ROOTS}
    assert {m for m in reached if (floor_of(m) or 0) > _floor("store")} == set()


def test_the_lifecycle_announces_to_listeners_it_does_not_import() -> None:
    assert "service.store.announce" in graph()["service.store.lifecycle"]
    listened = {"service.notify.outbox", "service.usage", "service.recovery.explain"}
    assert listened <= graph()["service.listeners"]


def test_the_docs_show_the_floors_as_the_code_has_them() -> None:
    page = (HERE / "docs" / "design" / "how-it-works.md").read_text()
    shown = re.search(r"<!-- floors -->\n```text\n(.*?)\n```", page, re.S)
    assert shown is not None, "how-it-works.md has no floors diagram"
    assert shown.group(1) == diagram(), "run python -m tests.module_graph --diagram"


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
ASSEMBLY = {"service.app", "service.dashboard", "service.shutdown", "service.telemetry"}
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


def test_no_module_is_named_like_a_standard_library_module() -> None:
    """A module named ``platform`` or ``types`` reads, in a traceback or an import, as the
    standard library's."""
    named = {m for m in modules() if m.rsplit(".", 1)[-1] in sys.stdlib_module_names}
    assert named == set()
