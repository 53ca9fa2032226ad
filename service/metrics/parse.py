"""The one parser for verl's console metric lines, as they appear in a Ray job log.

verl's console logger prints ``step:N - key:value - key:value ...`` with each value's ``repr``
(numpy scalars as ``np.float64(0.41)``, ``nan``, ``inf``, ``True``). Keys hold ``/ @ - _ .`` but
never ``:`` or spaces, so items split on `` - `` and each item on its last ``:``. Ray prefixes
actor output with ``(ActorName pid=..., ip=...)`` (possibly coloured). A line counts as a metric
line only when every item parses; anything else (``timing_s/param_sync: 7.41 seconds``) is not.
The verl launcher's preflight report is one line too (``jobs.verl_launch.PREFIX`` + JSON), and so
is each complete checkpoint a job reports (``jobs.checkpoints.PREFIX`` + JSON).
"""

from __future__ import annotations

import json
import re
from typing import Any, NamedTuple

from jobs.checkpoints import PREFIX as CHECKPOINT_PREFIX
from jobs.verl_launch import PREFIX as PREFLIGHT_PREFIX
from service.metrics.ansi import strip_ansi

_RAY_PREFIX = re.compile(r"^\((?:[^()\s]+ )?pid=\d+(?:, ip=[^)]*)?\)\s*")
_RAY_REPEAT = re.compile(r"\s*\[repeated \d+x across cluster\]\s*$")
_STEP = re.compile(r"^step:(\d{1,30})(?: - |$)")  # bounded: int() of any digit run is cheap
_KEY = re.compile(r"^[^\s:\x00-\x1f\x7f]+$")
_NUMPY = re.compile(r"^(?:np|numpy)\.(?:float|int|uint|bool_?)\d*\((.*)\)$")
_NUMBER = re.compile(r"^[+-]?(?:\d+\.?\d*(?:[eE][+-]?\d+)?|\.\d+(?:[eE][+-]?\d+)?|nan|inf)$")


class MetricLine(NamedTuple):
    step: int
    values: dict[str, float]


def parse_value(text: str) -> float | None:
    """A printed numeric value (plain, numpy repr, bool, nan, inf) or None if it is not one."""
    text = text.strip()
    numpy = _NUMPY.match(text)
    if numpy:
        text = numpy.group(1).strip()
    if text in ("True", "False", "np.True_", "np.False_"):
        return 1.0 if "True" in text else 0.0
    if not _NUMBER.match(text):
        return None
    return float(text)


def strip_ray_prefix(line: str) -> str:
    line = strip_ansi(line).rstrip("\r\n")
    return _RAY_REPEAT.sub("", _RAY_PREFIX.sub("", line, count=1))


def parse_line(line: str) -> MetricLine | None:
    """One log line to a metric line, or None when it is not one."""
    body = strip_ray_prefix(line).strip()
    match = _STEP.match(body)
    if not match:
        return None
    items = body[match.end() :].split(" - ") if match.end() < len(body) else []
    values: dict[str, float] = {}
    for item in items:
        key, sep, raw = item.rpartition(":")
        value = parse_value(raw) if sep else None
        if value is None or not _KEY.match(key):
            return None
        values[key] = value
    if not values:
        return None
    return MetricLine(step=int(match.group(1)), values=values)


def parse_preflight(line: str) -> dict[str, Any] | None:
    """The launcher's preflight report on this line, or None when it is not one."""
    body = strip_ray_prefix(line).strip()
    if not body.startswith(PREFLIGHT_PREFIX):
        return None
    try:
        report = json.loads(body[len(PREFLIGHT_PREFIX) :])
    except ValueError:
        return None
    return report if isinstance(report, dict) and "nodes" in report else None


def parse_checkpoint(line: str) -> int | None:
    """The step of the complete checkpoint this line reports, or None when it is not one."""
    body = strip_ray_prefix(line).strip()
    if not body.startswith(CHECKPOINT_PREFIX):
        return None
    try:
        step = json.loads(body[len(CHECKPOINT_PREFIX) :]).get("step")
    except (ValueError, AttributeError):
        return None
    return step if isinstance(step, int) and not isinstance(step, bool) and step >= 0 else None
