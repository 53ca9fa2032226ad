"""Terminal escape sequences in job logs: CSI (colours, cursor moves), OSC (titles, links) and
two-byte ones; Ray colours its actor prefixes with them."""

from __future__ import annotations

import re

ANSI = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)?|[@-Z\\-_])")


def strip_ansi(text: str) -> str:
    return ANSI.sub("", text)
