"""What every answer is made of: a document built from a row's attributes, the mark of a field
shown as its row stores it, and the one JSON encoding of every answer and streamed event."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Final

from pydantic import BaseModel
from pydantic_core import to_json


class _Stored:
    """The mark of ``STORED``."""

    def __repr__(self) -> str:
        return "STORED"


# A field marked ``Annotated[T, STORED]`` is its row's column of the same name, shown as stored:
# the read selects it and the builder copies it (``stored_fields``), so such a field is declared
# once, in its model. A field without the mark is made by its builder.
STORED: Final = _Stored()


def stored_fields(model: type[BaseModel]) -> tuple[str, ...]:
    """The fields of ``model`` marked ``STORED``, in its order."""
    return tuple(name for name, f in model.model_fields.items() if STORED in f.metadata)


def encode(doc: Any) -> bytes:
    """The one JSON encoding of every answer and streamed event (pydantic-core's serializer):
    datetimes in ISO 8601 with ``Z``; JSON has no NaN/inf, so they travel as the strings
    "NaN", "Infinity", "-Infinity"."""
    return to_json(doc, inf_nan_mode="strings")


def attributes(row: Any, names: Iterable[str]) -> dict[str, Any]:
    """The ``names`` of a row (a model's, or a result row with those columns), as a document."""
    return {name: getattr(row, name) for name in names}
