"""Keys a verl version has: the fields of the dataclasses verl builds its config sections into.

A section of verl's config with ``_target_: verl.workers.config.McoreEngineConfig`` under one
that verl turns into a dataclass at start (``omega_conf_to_dataclass``, which instantiates the
nested ``_target_`` sections too) rejects a key its dataclass lacks, so a key Hydra lets in with
``+key`` crashes the run. The fields are read from the installed verl's own source with ``ast``
(no import, so no torch), including fields inherited from verl base classes. Sections verl keeps
as plain config (``reward``, whose ``reward_kwargs`` verl's own scripts add) stay open.
"""

from __future__ import annotations

import ast
import difflib
import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from service.recipes.verl.hydra_check import verl_root

# The sections the fully async path of verl 0.9.1 builds into dataclasses: the workers'
# actor/ref/model configs (workers/engine_workers.py), the rollout config (agent_loop.py and
# rollout/replica.py, also for the reward model's replicas), distillation and the critic.
INSTANTIATED = (
    "actor_rollout_ref.actor",
    "actor_rollout_ref.ref",
    "actor_rollout_ref.model",
    "actor_rollout_ref.rollout",
    "reward.reward_model.rollout",
    "distillation",
    "critic",
)


@dataclass(frozen=True)
class ClassInfo:
    module: str
    bases: tuple[str, ...]
    fields: frozenset[str]
    is_dataclass: bool


@functools.cache
def _sources(root: Path) -> dict[str, str]:
    """verl's modules that define dataclasses: dotted module name -> source text."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        text = path.read_text(encoding="utf-8", errors="replace")
        if "dataclass" in text:
            module = ".".join(("verl", *path.relative_to(root).with_suffix("").parts))
            out[module.removesuffix(".__init__")] = text
    return out


@functools.lru_cache(maxsize=512)
def _classes(root: Path, name: str) -> tuple[ClassInfo, ...]:
    """Every top-level class called ``name`` in verl (only modules that mention it are parsed)."""
    found = []
    for module, text in _sources(root).items():
        if f"class {name}" not in text:
            continue
        try:
            tree = ast.parse(text)
        except SyntaxError:
            continue
        found += [
            _info(n, module) for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name
        ]
    return tuple(found)


def _info(node: ast.ClassDef, module: str) -> ClassInfo:
    fields = frozenset(
        stmt.target.id
        for stmt in node.body
        if isinstance(stmt, ast.AnnAssign)
        and isinstance(stmt.target, ast.Name)
        and "ClassVar" not in ast.unparse(stmt.annotation)
    )
    bases = tuple(b.attr if isinstance(b, ast.Attribute) else ast.unparse(b) for b in node.bases)
    decorators = [ast.unparse(d) for d in node.decorator_list]
    return ClassInfo(module, bases, fields, any("dataclass" in d for d in decorators))


def _find(root: Path, target: str) -> ClassInfo | None:
    module, _, name = target.rpartition(".")
    found = _classes(root, name)
    near = [c for c in found if c.module.startswith(module) or module.startswith(c.module)]
    return next(iter(near or found), None)


def fields_of(target: str, root: Path | None = None) -> frozenset[str] | None:
    """The fields of the dataclass ``target`` names (with inherited ones), or None if unknown."""
    root = root or verl_root()
    info = _find(root, target)
    if info is None or not info.is_dataclass:
        return None
    fields: set[str] = set()
    todo, seen = [info], set()
    while todo:
        cls = todo.pop()
        if id(cls) in seen:
            continue
        seen.add(id(cls))
        fields |= cls.fields
        todo.extend(base for b in cls.bases if (base := _find(root, b)) is not None)
    return frozenset(fields)


def version(root: Path | None = None) -> str:
    path = (root or verl_root()) / "version" / "version"
    return path.read_text().strip() if path.is_file() else "unknown"


def missing_field(base: dict[str, Any], key: str, root: Path | None = None) -> str | None:
    """Why ``key`` cannot be added to verl's config ``base``: the first part of it that is not
    there lands in a section verl builds into a dataclass without that field.

    None when the key exists, or lands in a section verl does not build into a dataclass.
    """
    parts = key.split(".")
    node: Any = base
    for depth, part in enumerate(parts):
        if not isinstance(node, dict):
            return None
        if part not in node:
            return _refusal(node, ".".join(parts[:depth]), part, key, root or verl_root())
        node = node[part]
    return None


def _refusal(node: dict[str, Any], section: str, name: str, key: str, root: Path) -> str | None:
    target = node.get("_target_")
    if not isinstance(target, str) or not target.startswith("verl."):
        return None
    if not any(section == root or section.startswith(root + ".") for root in INSTANTIATED):
        return None
    fields = fields_of(target, root)
    if fields is None or name in fields:
        return None
    close = difflib.get_close_matches(name, sorted(f for f in fields if f[0] != "_"), n=3)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    return (
        f"verl {version(root)} has no '{key}': it builds '{section}' into "
        f"{target.rpartition('.')[2]}, which has no field '{name}', so the run would crash "
        f"at start (adding it with + does not help){hint}"
    )
