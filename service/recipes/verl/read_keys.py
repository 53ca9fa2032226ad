"""The config keys verl's own source reads, for ``+key`` on nodes no dataclass describes.

Hydra lets ``+trainer.my_typo_key=1`` (or ``+megatron.grad_offload=True`` at the top level) into
a plain YAML node, and verl then never looks at it: the run starts and the setting does nothing.
``typed_keys`` covers the sections verl builds into dataclasses; for the rest, verl's Python
source is scanned with ``ast`` (never imported: it pulls torch) for config accesses:
``config.trainer.foo``, ``config.trainer.get("foo")``, ``cfg["data"]["foo"]``,
``OmegaConf.select(cfg, "a.b")``, and names bound to them (``t = config.trainer; t.foo``).

Which config a name holds is not known from the source alone, so the accesses are grouped by
name and scope (a function's locals, a class's ``self.*``): a group that reads a top-level key
of verl's config reads the whole config; any other is placed under each node of the config
whose keys it reads at least ``MIN_SHARED`` of (a dataset class reading ``prompt_key`` and
``max_prompt_length`` reads ``data``). The scan is kept per verl tree (one per version).

An added key no group reads is a warning naming the nearest key verl does read; a key verl is
known to have removed (``REMOVED``, each with its source) is refused.
"""

from __future__ import annotations

import ast
import contextlib
import difflib
import functools
import json
import os
import re
import threading
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from service.recipes.verl.hydra_check import base_config, verl_root
from service.recipes.verl.typed_keys import INSTANTIATED, version

# A name that holds (part of) verl's config, by how verl names them.
CONFIG_NAME = re.compile(r"conf|cfg", re.IGNORECASE)
# A group placed under a node of the config shares at least this many keys with it.
MIN_SHARED = 2
# Keys verl no longer has, with the release that dropped them and where that is said.
REMOVED = {
    "trainer.use_legacy_worker_impl": (
        "0.8.0",
        "the legacy fsdp/megatron workers it chose between were removed in verl 0.8.0 "
        "(verl-project/verl#5604); the engine workers are the only implementation",
    ),
}

Chain = tuple[str, ...]
# Attributes of a config object that are its methods, not keys.
METHODS = frozenset(
    ("get", "items", "keys", "values", "pop", "setdefault", "copy", "update", "select")
)


@dataclass(frozen=True)
class Scan:
    """What one verl tree's source reads: per (scope, name) group, its access chains."""

    groups: tuple[frozenset[Chain], ...]


def scan(root: Path, cache_dir: Path | None = None) -> Scan:
    """The access chains of every module of the verl tree at ``root``: kept in memory per tree
    and, with ``cache_dir``, on disk per verl version (a scan takes seconds; a release's source
    never changes)."""
    return _scan(root, cache_dir)


@functools.cache
def _scan(root: Path, cache_dir: Path | None) -> Scan:
    release = version(root)
    kept = (
        cache_dir / "read-keys" / f"{release}.json" if cache_dir and release != "unknown" else None
    )
    if kept is not None and kept.is_file():
        try:
            data = json.loads(kept.read_text(encoding="utf-8"))
            return Scan(tuple(frozenset(tuple(c) for c in group) for group in data["groups"]))
        except (OSError, ValueError, KeyError, TypeError):
            pass  # scanned again below
    groups: dict[tuple[str, str], set[Chain]] = defaultdict(set)
    for path in sorted(root.rglob("*.py")):
        text = path.read_text(encoding="utf-8", errors="replace")
        if not CONFIG_NAME.search(text):
            continue
        try:
            tree = ast.parse(text)
        except SyntaxError:
            continue
        _collect(tree, path.relative_to(root).as_posix(), groups)
    found = Scan(tuple(frozenset(chains) for chains in groups.values() if chains))
    if kept is not None:
        with contextlib.suppress(OSError):
            kept.parent.mkdir(parents=True, exist_ok=True)
            tmp = kept.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
            tmp.write_text(json.dumps({"groups": [sorted(g) for g in found.groups]}))
            tmp.replace(kept)
    return found


CHAINED = (ast.Attribute, ast.Subscript, ast.Call)
Function = ast.FunctionDef | ast.AsyncFunctionDef


def _collect(tree: ast.Module, module: str, groups: dict[tuple[str, str], set[Chain]]) -> None:
    """One pass over a module: per function, the names bound to a config chain and every
    config access, grouped by (scope, root name): a function's locals, a class's ``self.*``."""
    todo: list[tuple[ast.AST, str, Function | None]] = [(tree, "", None)]
    bodies: dict[Function, tuple[str, list[ast.Assign], list[ast.expr]]] = {}
    while todo:
        node, classes, function = todo.pop()
        if isinstance(node, ast.ClassDef):
            classes = f"{classes}.{node.name}"
        elif isinstance(node, Function) and function is None:
            function = node  # (nested functions count as part of the outer one)
            bodies[function] = (classes, [], [])
        elif function is not None:
            if isinstance(node, ast.Assign) and len(node.targets) == 1:
                bodies[function][1].append(node)
            elif isinstance(node, CHAINED):
                bodies[function][2].append(node)
        todo.extend((child, classes, function) for child in ast.iter_child_nodes(node))
    for function, (classes, assigns, accesses) in bodies.items():
        aliases: dict[str, tuple[str, Chain]] = {}
        for a in reversed(assigns):  # in source order
            target, found = _root(a.targets[0]), _chain(a.value)
            if target and found and found[1] and _is_config(found[0], aliases):
                aliases[target] = found
        for access in accesses:
            found = _chain(access)
            if found and found[1] and _is_config(found[0], aliases):
                root, parts = _resolve(found[0], found[1], aliases)
                scope = f"{module}:{classes}"
                if not root.startswith("self."):
                    scope += f":{function.name}:{function.lineno}"
                groups[(scope, root)].add(parts)


def _is_config(root: str, aliases: dict[str, tuple[str, Chain]]) -> bool:
    return root in aliases or CONFIG_NAME.search(root.rpartition(".")[2]) is not None


def _resolve(root: str, parts: Chain, aliases: dict[str, tuple[str, Chain]]) -> tuple[str, Chain]:
    for _ in range(8):  # a = config.x; b = a.y; ...
        if root not in aliases:
            break
        root, prefix = aliases[root]
        parts = prefix + parts
    return root, parts


def _root(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if (
        isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "self"
    ):
        return f"self.{node.attr}"
    return None


def _text(node: ast.expr) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _chain(node: ast.expr) -> tuple[str, Chain] | None:
    """``(root name, keys)`` of a config access, or None."""
    root = _root(node)
    if root is not None:
        return root, ()
    if isinstance(node, ast.Attribute):
        if node.attr in METHODS:
            return None  # a mapping's method, not a key
        inner = _chain(node.value)
        return (inner[0], (*inner[1], node.attr)) if inner else None
    if isinstance(node, ast.Subscript):
        key = _text(node.slice)
        inner = _chain(node.value)
        return (inner[0], (*inner[1], key)) if inner and key else None
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args:
        key = _text(node.args[0])
        if node.func.attr == "get" and key:
            inner = _chain(node.func.value)
            return (inner[0], (*inner[1], *key.split("."))) if inner else None
        if node.func.attr == "select" and len(node.args) > 1 and (key := _text(node.args[1])):
            inner = _chain(node.args[0])
            return (inner[0], (*inner[1], *key.split("."))) if inner else None
    return None


def _nodes(cfg: Any, prefix: Chain = ()) -> Iterator[tuple[Chain, dict[str, Any]]]:
    if isinstance(cfg, dict):
        yield prefix, cfg
        for k, v in cfg.items():
            yield from _nodes(v, (*prefix, str(k)))


@functools.cache
def known(
    config_name: str, root: Path | None = None, cache_dir: Path | None = None
) -> frozenset[str]:
    """Every dotted key (and prefix of one) verl's config has or verl's source reads, kept per
    entry config and verl tree."""
    base = base_config(config_name, root)
    nodes = list(_nodes(base))
    by_key: dict[str, list[Chain]] = defaultdict(list)
    for path, node in nodes:
        for k in node:
            by_key[str(k)].append(path)
    paths: set[Chain] = {(*path, str(k)) for path, node in nodes for k in node}
    for chains in scan(root or verl_root(), cache_dir).groups:
        firsts = {c[0] for c in chains}
        if firsts & set(base):  # this name holds the whole config
            paths |= chains
            continue
        shared: dict[Chain, int] = defaultdict(int)
        for first in firsts:
            for path in by_key.get(first, ()):
                shared[path] += 1
        for path, count in shared.items():
            if count >= MIN_SHARED:
                paths |= {(*path, *c) for c in chains}
    return frozenset(".".join(p[:i]) for p in paths for i in range(1, len(p) + 1))


def problem(
    config_name: str, key: str, root: Path | None = None, cache_dir: Path | None = None
) -> tuple[bool, str] | None:
    """For a key added with ``+``/``++``: ``(refused, message)`` if verl never reads it (a
    warning) or removed it (a refusal); None if it is read, in the config already, or lands in
    a node verl keeps open (an empty mapping, a leaf) or builds into a dataclass."""
    if key in REMOVED:
        since, why = REMOVED[key]
        return True, f"verl removed '{key}' in {since}: {why}"
    base = base_config(config_name, root)
    node: Any = base
    parts = key.split(".")
    for depth, part in enumerate(parts):
        if not isinstance(node, dict) or (depth and not node):
            return None  # under a leaf, or a mapping verl passes on whole (e.g. *_kwargs: {})
        if part not in node:
            break
        node = node[part]
    else:
        return None
    section = ".".join(parts[:depth])
    if isinstance(node, dict) and "_target_" in node:
        return None  # typed_keys decides a section verl builds into a class
    if any(section == s or section.startswith(s + ".") for s in INSTANTIATED):
        return None
    reads = known(config_name, root, cache_dir)
    if key in reads:
        return None
    return False, (
        f"verl {version(root or verl_root())} never reads '{key}': no dataclass describes "
        f"'{section or 'the top level'}' and verl's source reads no such key, so it would do "
        f"nothing{_nearest(key, reads)}"
    )


def _nearest(key: str, reads: frozenset[str]) -> str:
    """``; did you mean ...?`` with the key verl reads closest to ``key``: one that ends with
    it (the right key at the wrong place), else the closest under the same parent, else the
    closest anywhere."""
    ends = sorted((k for k in reads if k.endswith("." + key)), key=len)
    if ends:
        return f"; did you mean {ends[0]}?"
    parent = key.rpartition(".")[0]
    siblings = [k for k in reads if k.rpartition(".")[0] == parent]
    close = difflib.get_close_matches(key, siblings, n=1, cutoff=0.5)
    close = close or difflib.get_close_matches(key, sorted(reads), n=1, cutoff=0.6)
    return f"; did you mean {close[0]}?" if close else ""
