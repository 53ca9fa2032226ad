"""Run ids: time-ordered (newest sorts last), unique without coordination."""

from __future__ import annotations

import secrets
import time


def new_run_id() -> str:
    """``r`` + 12 hex digits of Unix milliseconds + 8 random hex digits."""
    return f"r{int(time.time() * 1000):012x}{secrets.token_hex(4)}"
