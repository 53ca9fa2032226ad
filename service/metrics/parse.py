"""The one parser for verl's console metric lines, as they appear in a Ray job log.

verl's console logger prints ``step:N - key:value - key:value ...`` with each value's ``repr``
(numpy scalars as ``np.float64(0.41)``, ``nan``, ``inf``, ``True``). Keys hold ``/ @ - _ .`` but
never ``:`` or spaces, so items split on `` - `` and each item on its last ``:``. Ray prefixes
actor output with ``(ActorName pid=..., ip=...)`` (possibly coloured). A line counts as a metric
line only when every item parses; anything else (``timing_s/param_sync: 7.41 seconds``) is not.
The verl launcher's preflight report is one line too (``jobs.verl_launch.PREFIX`` + JSON), and so
is each complete checkpoint a job reports (``jobs.checkpoints.PREFIX`` + JSON).

verl's fully async trainer also says each parameter version it syncs to the rollout, on a line
of its own (``[FullyAsyncTrainer] _fit_update_weights, ... self.current_param_version: N``,
before that sync's ``step:N`` lines). Its ``step:`` lines lag: they carry the version a step
trained with, and the last step's are never printed (verl 0.9.1: a finished run of 3 syncs
prints version 1 there at most). So the sync line is read as the point
``current_param_version = N`` at step N, and being first at its step, it is the one the store
keeps (a point already stored at a step is kept): a run's progress is the trainer's own word.
"""

from __future__ import annotations

import json
import re
from typing import Any, NamedTuple

from jobs.checkpoints import PREFIX as CHECKPOINT_PREFIX
from jobs.samples import PREFIX as SAMPLE_PREFIX
from jobs.verl_launch import PREFIX as PREFLIGHT_PREFIX
from service.metrics.ansi import strip_ansi
from service.metrics.keys import STEP_KEY

# Ray's "(Actor pid=N, ip=...)" before a line it forwards from a worker.
_RAY_PID = r"\((?:[^()\s]+ )?pid=\d+(?:, ip=[^)]*)?\)\s*"
_RAY_PREFIX = re.compile("^" + _RAY_PID)
_RAY_REPEAT = re.compile(r"\s*\[repeated \d+x across cluster\]\s*$")
# A worker's step line that Ray forwarded behind another writer's unfinished line (the driver's
# print writes its text and its newline apart; Ray's log thread can write in between).
_GLUED_STEP = re.compile(f".+({_RAY_PID}step:)")
_STEP = re.compile(r"^step:(\d{1,30})(?: - |$)")  # bounded: int() of any digit run is cheap
_KEY = re.compile(r"^[^\s:\x00-\x1f\x7f]+$")
_NUMPY = re.compile(r"^(?:np|numpy)\.(?:float|int|uint|bool_?)\d*\((.*)\)$")
_SYNCED = re.compile(
    r"^\[FullyAsyncTrainer\] _fit_update_weights,.*\bcurrent_param_version: (\d{1,30})\s*$"
)
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
    """One log line to a metric line, or None when it is not one. A worker's step line glued
    behind another writer's text (``_GLUED_STEP``) is read from its own prefix on, and one with
    a sample frame glued after it up to the frame."""
    got = _parse_line(line)
    if got is None and "step:" in line:
        # A sample frame the shipper wrote before the line's newline: the line ends where the
        # frame starts.
        head = strip_ansi(line).partition(SAMPLE_PREFIX)[0]
        glued = _GLUED_STEP.match(head)
        got = _parse_line(head[glued.start(1) :] if glued else head)
    return got


def _parse_line(line: str) -> MetricLine | None:
    body = strip_ray_prefix(line).strip()
    match = _STEP.match(body)
    if not match:
        synced = _synced(body)
        return None if synced is None else MetricLine(synced, {STEP_KEY: float(synced)})
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


def parse_synced(line: str) -> int | None:
    """The parameter version verl's fully async trainer says it synced on this line, or None
    when it is not such a line."""
    return _synced(strip_ray_prefix(line).strip())


def _synced(body: str) -> int | None:
    match = _SYNCED.match(body)
    return int(match.group(1)) if match else None


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
