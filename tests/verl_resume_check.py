"""An assertion for a real verl attempt that resumed: its log says it resumed where the
launcher said (``metrics.resumed``), for a test that has the attempt's whole job log."""

from __future__ import annotations

from service.metrics.parse import parse_line
from service.metrics.resumed import mismatch


def assert_resumed_where_said(log: str, step: int) -> None:
    """Fail when ``log`` (an attempt's job log) shows verl did not resume from checkpoint
    ``step``: another checkpoint loaded, another parameter version or data position, a first
    weight sync or step line below it."""
    lines = [m for line in log.splitlines() if (m := parse_line(line)) is not None]
    reason = mismatch(step, log, lines)
    assert reason is None, reason
    assert f"current_param_version to {step}" in log, "verl never said it resumed"
