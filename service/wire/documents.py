"""What every answer is made of: a document built from a row's attributes, and the one JSON
encoding of every answer and streamed event."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from pydantic_core import to_json


def encode(doc: Any) -> bytes:
    """The one JSON encoding of every answer and streamed event (pydantic-core's serializer):
    datetimes in ISO 8601 with ``Z``; JSON has no NaN/inf, so they travel as the strings
    "NaN", "Infinity", "-Infinity"."""
    return to_json(doc, inf_nan_mode="strings")


def attributes(row: Any, names: Iterable[str]) -> dict[str, Any]:
    """The ``names`` of a row (a model's, or a result row with those columns), as a document."""
    return {name: getattr(row, name) for name in names}
