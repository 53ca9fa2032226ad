"""Reading a Server-Sent Events stream (the CLI's ``status --follow``, and the tests)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any


def parse_sse(lines: Iterator[str]) -> Iterator[tuple[str, Any, str | None]]:
    """Server-Sent Events from text lines: (event name, JSON data, id) per event."""
    kind, data, event_id = "message", "", None
    for line in lines:
        if line.startswith("event: "):
            kind = line[7:]
        elif line.startswith("data: "):
            data += line[6:]
        elif line.startswith("id: "):
            event_id = line[4:]
        elif not line and (data or kind != "message"):
            yield kind, json.loads(data) if data else None, event_id
            kind, data, event_id = "message", "", None
