"""What every command group shares: the output (consoles, ``say``, ``emit_json``), the exit
codes, and ``connect`` (a client whose errors become a printed problem and an exit code); the
options the commands share are in ``options``."""

from __future__ import annotations

import json
import sys
import unicodedata
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, NoReturn

import typer
from pydantic import BaseModel
from rich.console import Console
from rich.text import Text

from service.client import ApiError, Client, Unreachable

console = Console(highlight=False)
errors = Console(stderr=True, highlight=False)

EXIT_RUN_FAILED, EXIT_USAGE, EXIT_REFUSED, EXIT_UNREACHABLE = 1, 2, 3, 4
STATUS_STYLE = {
    "QUEUED": "yellow",
    "SUBMITTED": "cyan",
    "RUNNING": "blue",
    "SUCCEEDED": "green",
    "FAILED": "red",
    "LOST": "red",
    "STOPPED": "magenta",
    "CANCELLED": "dim",
    "RETRYING": "yellow",
}


def clean(value: object, keep: str = "") -> str:
    """A user string made safe for a terminal: control characters (escape sequences
    included) and format characters (bidi overrides) removed, except those in ``keep``."""
    return "".join(
        ch for ch in str(value) if ch in keep or unicodedata.category(ch) not in ("Cc", "Cf")
    )


def say(*parts: object, style: str | None = None, to: Console = console) -> None:
    """Print user strings as they are: never read as rich markup."""
    to.print(Text(" ".join(clean(p) for p in parts), style=style or ""), soft_wrap=True)


def emit_json(data: Any) -> None:
    if isinstance(data, BaseModel):
        data = data.model_dump(mode="json")
    sys.stdout.write(json.dumps(data, indent=2) + "\n")


@contextmanager
def connect(server: str | None, token: str | None) -> Iterator[Client]:
    """A client; the errors it raises become a printed problem and an exit code."""
    try:
        with Client(server, token) as client:
            yield client
    except ApiError as exc:
        say(f"error {exc.status}: {exc.title}: {exc.detail}", style="red", to=errors)
        for e in exc.errors:
            say(f"  {e.field}: {e.msg}", to=errors)
        if exc.body.get("suggestion"):
            say(f"  suggestion: {exc.body['suggestion']}", to=errors)
        raise typer.Exit(EXIT_REFUSED) from exc
    except Unreachable as exc:
        say(str(exc), style="red", to=errors)
        raise typer.Exit(EXIT_UNREACHABLE) from exc


def usage_error(message: str) -> NoReturn:
    """Bad usage: one line on standard error, exit 2."""
    say(message, style="red", to=errors)
    raise typer.Exit(EXIT_USAGE)


def number(value: float | str | None) -> str:
    return "" if value is None else str(value) if isinstance(value, str) else f"{value:.4g}"
