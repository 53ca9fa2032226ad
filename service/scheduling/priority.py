"""Run priorities: the names a spec gives and the order the queue keeps (higher first)."""

from __future__ import annotations

PRIORITIES: dict[str, int] = {"low": 0, "normal": 1, "high": 2}
PRIORITY_NAMES = {v: k for k, v in PRIORITIES.items()}
