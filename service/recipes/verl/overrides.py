"""A spec's Hydra overrides, parsed once into typed ``Override`` values.

Every stage of the verl accept path (guard, compose, check, build: ``recipe.py``) takes these,
never the override strings: ``read`` is the one place an override string meets Hydra's parser
(``hydra_check.parse``). An override the parser refuses keeps its message in ``error``, for
the composition to report under its field.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from service.recipes.verl import hydra_check

Loc = tuple[str | int, ...]


@dataclass(frozen=True)
class Item:
    """One Hydra override as text, and the spec field (``loc``) that produced it."""

    text: str
    loc: Loc


@dataclass(frozen=True)
class Override:
    """One override: its text (what verl is given), the spec field it came from, and what it
    says (``parsed``: op, dotted key, value), or why Hydra's parser refuses it (``error``)."""

    text: str
    loc: Loc
    parsed: hydra_check.Parsed | None
    error: str | None = None

    @property
    def key(self) -> str | None:
        return self.parsed.key if self.parsed else None

    @property
    def op(self) -> str | None:
        """``=``, ``+``, ``++`` or ``~`` (None when it does not parse)."""
        return self.parsed.op if self.parsed else None

    @property
    def value(self) -> Any:
        return self.parsed.value if self.parsed else None

    @property
    def group(self) -> bool:
        return self.parsed.group if self.parsed else False

    def rewritten(self, text: str, value: Any) -> Override:
        """The same override with another value (and its text, already rendered)."""
        assert self.parsed is not None
        return replace(self, text=text, parsed=replace(self.parsed, value=value))


def read(text: str, loc: Loc) -> Override:
    try:
        return Override(text, loc, hydra_check.parse(text))
    except ValueError as exc:
        return Override(text, loc, None, str(exc))


def parse_all(items: Iterable[Item]) -> list[Override]:
    return [read(item.text, item.loc) for item in items]


def compose(
    config_name: str,
    overrides: list[str],
    root: Path | None = None,
    then: tuple[str, ...] = (),
) -> dict[str, Any]:
    """``hydra_check.compose_typed`` of override strings (read here)."""
    return hydra_check.compose_typed(
        config_name,
        [read(text, ("overrides", i)) for i, text in enumerate(overrides)],
        root,
        [read(text, ("overrides", i)) for i, text in enumerate(then, start=len(overrides))],
    )
