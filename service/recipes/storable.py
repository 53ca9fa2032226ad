"""Values both databases store alike: checked on the raw request body before any recipe sees it.

PostgreSQL refuses NUL in text and in ``jsonb``, lone surrogates in UTF-8, and the non-standard
``NaN``/``Infinity`` tokens Python's JSON parser accepts; SQLite would take them all. Control
characters are refused too (a name with terminal escapes misleads whoever reads it), except
tab and line breaks in free text; names and teams take none.
"""

from __future__ import annotations

import math
import unicodedata
from typing import Any

from service.errors import InvalidSpec, field_error

_LINE_BREAKS = frozenset("\t\n\r")
_ONE_LINE = frozenset({("name",), ("team",)})


def _refusal(value: str, one_line: bool) -> str | None:
    for char in value:
        kind = unicodedata.category(char)
        if kind == "Cs":
            return "must be valid Unicode (a lone surrogate is not)"
        if kind == "Cc" and (one_line or char not in _LINE_BREAKS):
            return f"must not contain control characters (found U+{ord(char):04X})"
    return None


def problems(value: Any, loc: tuple[str | int, ...] = ()) -> list[dict[str, Any]]:
    """Every field of ``value`` no database would store as given, as 422 errors."""
    if isinstance(value, str):
        msg = _refusal(value, loc in _ONE_LINE)
        return [field_error(loc, msg, "unstorable_string")] if msg else []
    if isinstance(value, float) and not math.isfinite(value):
        return [field_error(loc, "must be a finite number", "finite_number")]
    out: list[dict[str, Any]] = []
    if isinstance(value, dict):
        for key, item in value.items():
            key_msg = _refusal(str(key), True)
            if key_msg:
                out.append(field_error([*loc, str(key)], f"key {key_msg}", "unstorable_string"))
            out += problems(item, (*loc, str(key)))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            out += problems(item, (*loc, index))
    return out


def check(body: Any) -> None:
    """Raise a 422 naming each field whose value no database would store as given."""
    errors = problems(body)
    if errors:
        raise InvalidSpec(f"{len(errors)} unstorable field(s), first: {errors[0]['field']}", errors)
