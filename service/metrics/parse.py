"""The one parser for verl's console metric lines, as they appear in a Ray job log.

verl's console logger prints ``step:N - key:value - key:value ...`` with each value's ``repr``
(numpy scalars as ``np.float64(0.41)``, ``nan``, ``inf``, ``True``). Keys hold ``/ @ - _ .`` but
never ``:`` or spaces, so items split on `` - `` and each item on its last ``:``. Ray prefixes
actor output with ``(ActorName pid=..., ip=...)`` (possibly coloured). A line counts as a metric
line only when every item parses; anything else (``timing_s/param_sync: 7.41 seconds``) is not.
The verl launcher's preflight report is one line too (``jobs.verl_launch.PREFIX`` + JSON), and so
is each complete checkpoint a job reports (``jobs.checkpoints.PREFIX`` + JSON), and each side's
digest of a weight sync (``jobs.weight_digest.PREFIX`` + JSON).

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
from collections.abc import Sequence
from typing import Any, NamedTuple

from jobs.checkpoints import PREFIX as CHECKPOINT_PREFIX
from jobs.samples import PREFIX as SAMPLE_PREFIX
from jobs.verl_launch import PREFIX as PREFLIGHT_PREFIX
from jobs.weight_digest import PREFIX as WEIGHTS_PREFIX
from service.metrics.ansi import strip_ansi
from service.metrics.keys import STEP_KEY

# Ray's "(Actor pid=N, ip=...)" before a line it forwards from a worker.
_RAY_TAG = r"\((?:[^()\s]+ )?pid=\d+(?:, ip=[^)]*)?\)"
_RAY_PID = _RAY_TAG + r"\s*"
_RAY_PREFIX = re.compile("^" + _RAY_PID)
_RAY_REPEAT = re.compile(r"\s*\[repeated \d+x across cluster\]\s*$")
# A step line glued behind another line's unfinished text: another writer's (the driver's print
# writes its text and its newline apart; Ray's log thread can write in between), or another
# thread's of the same worker (``Dumped generations to .../19.jsonlstep:19 - ...``). The first
# such step, and never a key's tail (``training/global_step:18 - ``).
_GLUED_STEP = re.compile(rf".+?((?:{_RAY_PID}|(?<![\s/_.@-]))step:\d{{1,30}} - )")
# A worker's line as Ray forwards it: its exact prefix (colours gone) and its text.
_WORKER_LINE = re.compile(rf"^({_RAY_TAG}) ?(.*)$", re.DOTALL)
# How many lines after a cut step line its rest may come (the other workers' lines between).
REJOIN_WITHIN = 64
_STEP = re.compile(r"^step:(\d{1,30})(?: - |$)")  # bounded: int() of any digit run is cheap
_KEY = re.compile(r"^[^\s:\x00-\x1f\x7f]+$")
_NUMPY = re.compile(r"^(?:np|numpy)\.(?:float|int|uint|bool_?)\d*\((.*)\)$")
_SYNCED = re.compile(
    r"^\[FullyAsyncTrainer\] _fit_update_weights,.*\bcurrent_param_version: (\d{1,30})\s*$"
)
# A step line's last value with another thread's print glued behind it before the line's newline
# (verl's trainer says ``Dumped generations to ...`` from a thread of its own): ``0.39Dumped``.
_GLUED_VALUE = re.compile(
    r"^((?:np|numpy)\.\w+\([^()]*\)|[+-]?(?:\d+\.?\d*(?:[eE][+-]?\d+)?|\.\d+)|nan|inf|True|False)"
    r"[A-Z\[(]"
)
_NUMBER = re.compile(r"^[+-]?(?:\d+\.?\d*(?:[eE][+-]?\d+)?|\.\d+(?:[eE][+-]?\d+)?|nan|inf)$")


_DIGEST = re.compile(r"^[0-9a-f]{64}$")


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


def parse_lines(lines: Sequence[tuple[int, str]]) -> list[tuple[int, MetricLine]]:
    """The metric lines among ``lines`` ((end offset, line) pairs, in order), each with the end
    of the last line it was read from. A step line that reached the log in two parts is read
    whole: Ray's log monitor forwards what it has read of a worker's file as a line, and reads
    it while a long line is still being written (verl's step lines are about 6 KB), so a step
    line can end mid-item and its rest be a later line of the same worker, other lines between
    (that worker's progress bar, other workers')."""
    out: list[tuple[int, MetricLine]] = []
    taken: set[int] = set()
    for i, (end, line) in enumerate(lines):
        if i in taken:
            continue
        metric = parse_line(line)
        if "step:" in line and (cut := _rest_of(lines, i)) is not None:
            j, metric = cut
            taken.add(j)
            end = lines[j][0]
        if metric is not None:
            out.append((end, metric))
    return sorted(out, key=lambda got: got[0])  # a rejoined line ends where its rest does


def _rest_of(lines: Sequence[tuple[int, str]], i: int) -> tuple[int, MetricLine] | None:
    """The line after ``i`` that is the rest of the step line ``i`` cut short, with the whole
    line read; None if ``i`` is no step line or has no such rest. Its rest is the next line of
    the same worker (its progress bar's aside) if, joined to it, they read as a metric line."""
    worker, text = _worker_line(lines[i][1])
    text = text.lstrip()
    if not _STEP.match(text) or (j := _next_said(lines, i, worker)) is None:
        return None
    rest = _worker_line(lines[j][1])[1]
    whole = text + rest
    if _STEP.match(rest.strip()):
        return None  # a step line of its own: not the rest
    # A line that reads whole alone takes a rest of items only, never its worker's next print.
    got = _parse_line(whole, glued=_parse_line(text) is None)
    return None if got is None else (j, got)


def awaiting_rest(lines: Sequence[tuple[int, str]]) -> int | None:
    """The index of the first step line among ``lines`` whose rest may be still to come: its
    worker has said no other line since (within ``REJOIN_WITHIN`` lines), so what follows in a
    later read may be the rest of it (a step line cut short can even parse: ``...:0.5|2``).
    Only a worker's lines are cut so: the driver's own reach the job log whole."""
    for i in range(max(0, len(lines) - REJOIN_WITHIN), len(lines)):
        line = lines[i][1]
        if "step:" not in line:
            continue
        worker, text = _worker_line(line)
        if worker and _STEP.match(text.lstrip()) and _next_said(lines, i, worker) is None:
            return i
    return None


def _next_said(lines: Sequence[tuple[int, str]], i: int, worker: str) -> int | None:
    """The index of the next line after ``i`` that ``worker`` said (within ``REJOIN_WITHIN``),
    passing its bare newlines, its progress bar (a carriage return) and other workers' lines."""
    for j in range(i + 1, min(len(lines), i + 1 + REJOIN_WITHIN)):
        other, rest = _worker_line(lines[j][1])
        if other == worker and rest.strip() and "\r" not in rest:
            return j
    return None


def _worker_line(line: str) -> tuple[str, str]:
    """A forwarded line's exact worker prefix ("" for the driver's own) and its text."""
    line = strip_ansi(line).rstrip("\r\n")
    worker = _WORKER_LINE.match(line)
    return (worker.group(1), worker.group(2)) if worker else ("", line)


def _item(item: str) -> tuple[str, float] | None:
    """One ``key:value`` item of a step line, or None if it is not one."""
    key, sep, raw = item.rpartition(":")
    value = parse_value(raw) if sep else None
    return None if value is None or not _KEY.match(key) else (key, value)


def _glued_item(item: str) -> tuple[str, float] | None:
    """An item whose value has another print glued behind it (``_GLUED_VALUE``), read up to
    it; None if it is no such item. The glued text may hold ``:`` and `` - `` itself."""
    key, sep, raw = item.partition(":")
    glued = _GLUED_VALUE.match(raw) if sep and _KEY.match(key) else None
    return None if glued is None else _item(f"{key}:{glued.group(1)}")


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


def _parse_line(line: str, glued: bool = True) -> MetricLine | None:
    """``line`` as a metric line; with ``glued``, one whose last value has another print glued
    behind it too (``_GLUED_VALUE``)."""
    body = strip_ray_prefix(line).strip()
    match = _STEP.match(body)
    if not match:
        synced = _synced(body)
        return None if synced is None else MetricLine(synced, {STEP_KEY: float(synced)})
    items = body[match.end() :].split(" - ") if match.end() < len(body) else []
    values: dict[str, float] = {}
    for item in items:
        if (kv := _item(item)) is not None:
            values[kv[0]] = kv[1]
            continue
        if not glued or (kv := _glued_item(item)) is None:
            return None
        values[kv[0]] = kv[1]
        break  # the rest is the other print's
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


class WeightDigest(NamedTuple):
    """One side's digest of a weight sync: the trainer's for a parameter version, or a rollout
    worker's of what its model loaded (with its read-back: parameters equal, checked)."""

    side: str
    digest: str
    version: int | None = None
    read_back: tuple[int, int] | None = None


def parse_weights(line: str) -> WeightDigest | None:
    """The weight-sync digest this line reports, or None when it is not one."""
    body = strip_ray_prefix(line).strip()
    if not body.startswith(WEIGHTS_PREFIX):
        return None
    try:
        record = json.loads(body[len(WEIGHTS_PREFIX) :])
    except ValueError:
        return None
    if not isinstance(record, dict):
        return None
    side, digest = record.get("side"), record.get("digest")
    if not isinstance(digest, str) or not _DIGEST.match(digest):
        return None
    version = record.get("version")
    if side == "trainer" and _count(version):
        return WeightDigest("trainer", digest, version=version)
    back = record.get("read_back")
    if side == "rollout" and isinstance(back, list) and len(back) == 2 and all(map(_count, back)):
        return WeightDigest("rollout", digest, read_back=(back[0], back[1]))
    return None


def _count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**62
