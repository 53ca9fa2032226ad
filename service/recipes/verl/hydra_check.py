"""verl's own Hydra config, without importing verl: compose once, apply overrides per spec.

The YAML trees ship in the ``verl`` wheel; ``importlib.util.find_spec`` finds them without running
verl's ``__init__`` (which needs torch). The base config of each entry config is composed once with
hydra-core and kept as a plain container. A spec's overrides are parsed with Hydra's own override
parser (``parse``, cached per string; ``overrides.read`` is its one caller on the accept path, and
this module knows an override only by its ``Composable`` shape) and applied to a copy of that
container with the rules Hydra applies in struct mode: a plain ``key=value`` must name an existing
key, ``+key`` must not (unless it is null), ``++key`` may, ``~key`` deletes. Overrides that change
the defaults list (config groups such as ``model_engine=megatron``) cannot be applied that way;
those lists, and any list this shortcut refuses, are composed with Hydra in full (cached per
override tuple), so Hydra decides every refusal."""

from __future__ import annotations

import functools
import importlib.util
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from service.errors import Unavailable

FULLY_ASYNC_CONFIG = "experimental/fully_async_policy/config"
TRAINER_CONFIG = "trainer/config"
MISSING = object()


class VerlNotInstalled(Unavailable, title="verl config unavailable"): ...


# What a refusal from Hydra's own composition says: its message may quote composed values.
COMPOSE_REFUSED = "verl's config cannot be composed with this override"


class OverrideError(Exception):
    """Overrides Hydra would refuse: ``(index in the list or -1, message)`` pairs. ``hint`` is
    Hydra's own first line, kept to find the culprit and never shown."""

    def __init__(self, problems: list[tuple[int, str]], hint: str = "") -> None:
        super().__init__("; ".join(msg for _, msg in problems))
        self.problems = problems
        self.hint = hint


@dataclass(frozen=True)
class Parsed:
    """One parsed override: its kind (``""``, ``+``, ``++``, ``~``), dotted key and value."""

    kind: str
    key: str
    value: Any
    group: bool
    package: str | None = None

    @property
    def op(self) -> str:
        """``=``, ``+``, ``++`` or ``~``."""
        return self.kind or "="


class Composable(Protocol):
    """What composing reads of an override (``overrides.Override`` is one): its text, and what
    it says or why Hydra's parser refuses it."""

    @property
    def text(self) -> str: ...

    @property
    def parsed(self) -> Parsed | None: ...

    @property
    def error(self) -> str | None: ...


def verl_root() -> Path:
    """The installed ``verl`` package directory (found, not imported)."""
    try:
        spec = importlib.util.find_spec("verl")
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise VerlNotInstalled(
            "verl is not installed next to the service, so run specs cannot be checked against "
            "verl's Hydra config; install it with `pip install --no-deps verl==0.9.1`"
        )
    root = Path(next(iter(spec.submodule_search_locations)))
    if not (root / FULLY_ASYNC_CONFIG / "fully_async_ppo_trainer.yaml").is_file():
        raise VerlNotInstalled(f"verl at {root} does not ship the fully async config YAML")
    return root


_lock = threading.Lock()
_importing = threading.Lock()


def _import_hydra() -> None:
    """Hydra imported by one thread at a time. Its modules import one another: two threads
    importing it for the first time by different modules can deadlock on Python's import locks,
    which leaves a module half made, and every later spec failing, until the process ends."""
    with _importing:
        import hydra.core.override_parser.overrides_parser  # noqa: F401
        import omegaconf  # noqa: F401


def _compose(
    config_name: str, overrides: tuple[str, ...], root: Path | None = None
) -> dict[str, Any]:
    _import_hydra()
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    root = root or verl_root()
    searchpath = f"hydra.searchpath=[file://{root / TRAINER_CONFIG}]"
    # The entry config's own dir: fully async's, or (its V1 trainer's ppo_trainer) verl's
    # trainer config, which Hydra does not search for a primary config.
    own = root / FULLY_ASYNC_CONFIG
    if not (own / f"{config_name}.yaml").is_file() and (root / TRAINER_CONFIG).is_dir():
        own = root / TRAINER_CONFIG
    # Hydra's global state is process-wide: one composition at a time.
    with (
        _lock,
        initialize_config_dir(config_dir=str(own), version_base=None),
    ):
        try:
            cfg = compose(config_name, overrides=[searchpath, *overrides])
        except Exception as exc:
            # Hydra reports bad overrides as its own errors, ValueError, TypeError or a YAML
            # error; any of them may quote composed values, so none is passed on.
            hint = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise OverrideError([(-1, COMPOSE_REFUSED)], hint) from exc
    out: dict[str, Any] = OmegaConf.to_container(cfg, resolve=False)  # type: ignore[assignment]
    return out


@functools.cache
def base_config(config_name: str, root: Path | None = None) -> dict[str, Any]:
    """The entry config with no overrides, as a plain container (interpolations unresolved), of
    the verl at ``root`` (default: the installed one)."""
    return _compose(config_name, (), root)


@functools.lru_cache(maxsize=64)
def _composed_with_groups(
    config_name: str, overrides: tuple[str, ...], root: Path | None
) -> dict[str, Any]:
    return _compose(config_name, overrides, root)


@functools.lru_cache(maxsize=1)
def _config_groups() -> frozenset[str]:
    root = verl_root()
    return frozenset(
        p.name
        for base in (root / TRAINER_CONFIG, root / FULLY_ASYNC_CONFIG)
        for p in base.iterdir()
        if p.is_dir() and not p.name.startswith("_")
    )


@functools.lru_cache(maxsize=8192)
def parse(text: str) -> Parsed:
    """Parse one override with Hydra's grammar; ``ValueError`` with Hydra's message if bad."""
    _import_hydra()
    from hydra.errors import HydraException

    try:
        override = _parser().parse_override(text)
    except HydraException as exc:
        raise ValueError(str(exc).splitlines()[0]) from exc
    if override.is_sweep_override():
        raise ValueError("sweeps (several values) are not a single run")
    kind = "~" if override.is_delete() else "++" if override.is_force_add() else ""
    kind = "+" if override.is_add() else kind
    key = override.key_or_group
    group = (
        override.package is not None or "/" in key or ("." not in key and key in _config_groups())
    )
    return Parsed(kind, key, override.value(), group, override.package)


@functools.cache
def _parser() -> Any:
    from hydra.core.override_parser.overrides_parser import OverridesParser

    return OverridesParser.create()


def compose_typed(
    config_name: str,
    overrides: Sequence[Composable],
    root: Path | None = None,
    then: Sequence[Composable] = (),
) -> dict[str, Any]:
    """verl's config with ``overrides`` applied, as Hydra would compose it (a fresh container),
    for the verl at ``root`` (default: the installed one), and then the plain overrides ``then``
    (values that differ per run, on keys no other override touches).

    Compositions are kept by their inputs (entry config, the exact override texts, the verl
    tree), so the same spec is composed once however often it is checked. Raises
    ``OverrideError`` naming each override Hydra would refuse (those in ``then`` numbered after
    ``overrides``).
    """
    cfg: dict[str, Any] = copy_tree(_composed(config_name, overrides, root))
    for i, o in enumerate(then, start=len(overrides)):
        if o.parsed is None:
            raise OverrideError([(i, o.error or COMPOSE_REFUSED)])
        try:
            _apply(cfg, o.parsed)
        except (KeyError, ValueError) as exc:
            raise OverrideError([(i, str(exc.args[0]))]) from None
    return cfg


KEPT = 128
_kept: OrderedDict[tuple[str, tuple[str, ...], Path | None], dict[str, Any]] = OrderedDict()
_kept_lock = threading.Lock()


def _composed(
    config_name: str, overrides: Sequence[Composable], root: Path | None
) -> dict[str, Any]:
    # Kept by the override texts (what Hydra would be given); never handed out, ``compose_typed``
    # copies it. A refusal is not kept.
    key = (config_name, tuple(o.text for o in overrides), root)
    with _kept_lock:
        if key in _kept:
            _kept.move_to_end(key)
            return _kept[key]
    cfg = _compose_overrides(config_name, overrides, root)
    with _kept_lock:
        _kept[key] = cfg
        while len(_kept) > KEPT:
            _kept.popitem(last=False)
    return cfg


def _compose_overrides(
    config_name: str, overrides: Sequence[Composable], root: Path | None
) -> dict[str, Any]:
    problems = [(i, o.error or COMPOSE_REFUSED) for i, o in enumerate(overrides) if not o.parsed]
    if problems:
        raise OverrideError(problems)
    parsed = [o.parsed for o in overrides if o.parsed is not None]
    texts = tuple(o.text for o in overrides)
    if any(p.group for p in parsed):
        try:
            composed: dict[str, Any] = copy_tree(_composed_with_groups(config_name, texts, root))
            return composed
        except OverrideError as exc:
            culprit = _culprit(parsed, exc.hint)
            where = f"override {culprit}" if culprit >= 0 else "the overrides"
            raise OverrideError([(culprit, f"{COMPOSE_REFUSED} ({where})")]) from None
    cfg: dict[str, Any] = copy_tree(base_config(config_name, root))
    for i, p in enumerate(parsed):
        try:
            _apply(cfg, p)
        except KeyError as exc:
            problems.append((i, str(exc.args[0])))
    if problems:
        # Hydra has the last word on a refusal (and the odd form, like a list index, it takes).
        try:
            hydra_composed: dict[str, Any] = _composed_with_groups(config_name, texts, root)
        except OverrideError:
            raise OverrideError(problems) from None
        cfg = copy_tree(hydra_composed)
    return cfg


def _culprit(parsed: list[Parsed], message: str) -> int:
    for i, p in enumerate(parsed):
        if f"'{p.key}'" in message:
            return i
    return -1


def copy_tree(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: copy_tree(v) for k, v in node.items()}
    if isinstance(node, list):
        return [copy_tree(v) for v in node]
    return node


def _apply(cfg: dict[str, Any], p: Parsed) -> None:
    """Hydra's rules for one override (``ConfigLoaderImpl._apply_overrides_to_config``)."""
    *parents, leaf = p.key.split(".")
    node: Any = cfg
    for depth, part in enumerate(parents):
        if part not in node:
            if p.kind not in ("+", "++"):
                raise KeyError(_not_in_struct(p.key, ".".join(parents[: depth + 1])))
            node[part] = {}
        elif not isinstance(node[part], dict):
            node[part] = {}  # OmegaConf.update replaces a leaf on the way with a mapping
        node = node[part]
    current = node.get(leaf)
    if p.kind == "~":
        if current is None:
            raise KeyError(f"Could not delete '{p.key}': it is not in verl's config")
        if p.value is not None and current != p.value:
            raise KeyError(f"Could not delete '{p.key}': its value is not {p.value!r}")
        del node[leaf]
        return
    if p.kind == "+" and current is not None and not isinstance(p.value, dict | list):
        raise KeyError(
            f"Could not append to config. An item is already at '{p.key}'; "
            f"override it with {p.key}=... instead"
        )
    if p.kind == "" and leaf not in node:
        raise KeyError(_not_in_struct(p.key, p.key))
    if isinstance(p.value, dict) and isinstance(current, dict):
        _merge(current, copy_tree(p.value), p.key, struct=p.kind == "")
    else:
        node[leaf] = copy_tree(p.value)


def _merge(dst: dict[str, Any], src: dict[str, Any], key: str, struct: bool) -> None:
    for k, v in src.items():
        if struct and k not in dst:
            raise KeyError(_not_in_struct(f"{key}.{k}", f"{key}.{k}"))
        if isinstance(v, dict) and isinstance(dst.get(k), dict):
            _merge(dst[k], v, f"{key}.{k}", struct)
        else:
            dst[k] = v


def _not_in_struct(key: str, missing: str) -> str:
    return (
        f"Could not override '{key}': key '{missing}' is not in verl's config. "
        f"To add a new key write +{key}=..."
    )


def select(cfg: dict[str, Any], key: str, default: Any = None) -> Any:
    """The value at a dotted key, following plain ``${a.b}`` interpolations; else ``default``."""
    node: Any = cfg
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return default
        node = node[part]
    if isinstance(node, str) and node.startswith("${") and node.endswith("}"):
        inner = node[2:-1]
        if ":" not in inner and "${" not in inner and inner != key:
            return select(cfg, inner, default)
    return node
