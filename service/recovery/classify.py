"""Why a run failed, read from its log and Ray's word on the job: a class, a one-line summary,
the decisive lines with their offsets in the kept log, and a hint of what to change.

A log usually holds a cause and then its echoes (an actor that ran out of memory, then "the
actor died"), so the classes come in two tiers: causes (out of memory, a collective timing out,
a lost node, a missing file or module, a bad override, a shape that cannot be scheduled), of
which the earliest in the log wins, and effects (the async pipeline failing, an actor dying),
named only when no cause is found. A loss that turns NaN is read from verl's metric lines
(``metrics.parse``). A log with neither is ``unknown``, never a guess, its evidence the last
lines that show an error. The rules are ``recovery.rules``.
"""

from __future__ import annotations

import bisect
import math
import re
from dataclasses import dataclass, field
from typing import get_args

from service.metrics.ansi import strip_ansi
from service.metrics.parse import parse_line
from service.recovery import echoes, rules
from service.recovery.rules import Rule
from service.retry_policy import RetryClass

# The classes a run's failure can have (``RetryClass``), and ``cancelled``.
FAILURE_CLASSES: tuple[str, ...] = (*get_args(RetryClass), "cancelled")
MAX_EVIDENCE = 3
MAX_LINE = 300


@dataclass(frozen=True)
class Evidence:
    offset: int | None  # of the line's first character in the kept log (None: Ray's message)
    line: str


@dataclass(frozen=True)
class Failure:
    cls: str
    summary: str
    hint: str
    evidence: list[Evidence] = field(default_factory=list)


# A line Ray's autoscaler prints into every driver's log (any job's demand that no node fits):
# never evidence of what happened to this run. Jobs are started with these events off
# (``loops.submitter``); a log from before then, or a job that turned them on, may hold them.
_CLUSTER_WIDE = "(autoscaler +"
# Ray's prefix of a rollout server's or engine's line, or a frame in rollout code.
_ROLLOUT_LINE = re.compile(r"vllm|sglang|rollout|Rollouter", re.I)
_NAN = rules.rule("nan")


def classify(
    log: str,
    offset: int = 0,
    ray_error_type: str | None = None,
    ray_message: str = "",
    ray_state: str = "",
) -> Failure:
    """The failure that ``log`` (starting at ``offset`` in the kept log), Ray's state API's
    lines on the job (``recovery.deaths``: a cause there outranks an effect in the log) and
    Ray's error type and message show."""
    lines, state = _Text(log, offset), _Text(ray_state, None)
    found = _first_cause(lines) or _first_cause(state) or _effect(lines) or _effect(state)
    message = _Text(ray_message, None)
    if found is None and ray_message:
        found = _first_cause(message) or _effect(message)
    if found is None and ray_error_type in rules.RAY_ERRORS:
        rule = rules.rule(rules.RAY_ERRORS[ray_error_type])
        return Failure(rule.cls, f"{rule.summary} (Ray: {ray_error_type})", rule.hint)
    if found is None:
        last = _last_errors(lines) or _last_errors(message)
        return Failure("unknown", "no known cause in the log", _UNKNOWN_HINT, last)
    rule, evidence = found
    hint = _memory_hint(evidence) if rule.cls == "npu_oom" else rule.hint
    return Failure(rule.cls, rule.summary, hint, evidence)


_UNKNOWN_HINT = "the evidence holds the log's last error lines; the lines above them, the cause"


class _Text:
    """A text read for a failure: its lines' starts (each rule searches the whole text once,
    then a match is placed on its line), the offset of each line in the kept log (``offset``
    plus its place; None for Ray's word) and the lines that are never evidence: the
    autoscaler's on the whole cluster, and the reports of tasks cancelled because something
    else failed (``recovery.echoes``)."""

    def __init__(self, text: str, offset: int | None) -> None:
        self.text, self.offset = text, offset
        self.starts = [0, *(m.end() for m in _NEWLINE.finditer(text))]
        if self.starts[-1] == len(text):
            self.starts.pop()  # no line after the last newline
        self.skipped = (
            {i for i, at in enumerate(self.starts) if self._cluster_wide(at)}
            if _CLUSTER_WIDE in text
            else set()
        )
        if "CancelledError" in text:  # tasks cancelled because something else failed
            self.skipped |= echoes.cancelled([self.line(i) for i in range(len(self.starts))])

    def line(self, i: int) -> str:
        end = self.starts[i + 1] if i + 1 < len(self.starts) else len(self.text)
        return self.text[self.starts[i] : end]

    def evidence(self, i: int) -> Evidence:
        where = None if self.offset is None else self.offset + self.starts[i]
        return Evidence(where, self.line(i).rstrip()[:MAX_LINE])

    def matching(self, pattern: re.Pattern[str], most: int) -> list[int]:
        """The first ``most`` lines ``pattern`` matches in (their indices)."""
        found: list[int] = []
        for match in pattern.finditer(self.text):
            i = bisect.bisect_right(self.starts, match.start()) - 1
            if i not in self.skipped and (not found or found[-1] != i):
                found.append(i)
                if len(found) == most:
                    break
        return found

    def _cluster_wide(self, at: int) -> bool:
        return strip_ansi(self.text[at : at + 40]).startswith(_CLUSTER_WIDE)


_NEWLINE = re.compile(r"\r\n|\n|\r")


def _first_cause(text: _Text) -> tuple[Rule, list[Evidence]] | None:
    """The cause whose first line comes earliest (a loss turning NaN included; a tie goes to
    the rule listed first), a wait to be placed only when no other cause shows."""
    best: tuple[bool, int, Rule, list[int]] | None = None
    for rule in rules.CAUSES:
        found = text.matching(rule.pattern, MAX_EVIDENCE)
        candidate = (rule.cls in rules.WAITS, found[0] if found else 0, rule, found)
        if found and (best is None or candidate[:2] < best[:2]):
            best = candidate
    nan = _nan_loss(text)
    if nan is not None and (best is None or (False, nan) < best[:2]):
        best = (False, nan, _NAN, [nan])
    return None if best is None else (best[2], [text.evidence(i) for i in best[3]])


def _effect(text: _Text) -> tuple[Rule, list[Evidence]] | None:
    for rule in rules.EFFECTS:
        if found := text.matching(rule.pattern, MAX_EVIDENCE):
            return rule, [text.evidence(i) for i in found]
    return None


def _nan_loss(text: _Text) -> int | None:
    """The first of verl's metric lines where a loss is NaN (its index)."""
    for i in text.matching(_NAN_CANDIDATE, len(text.starts)):
        metric = parse_line(text.line(i))
        if metric and any("loss" in k and math.isnan(v) for k, v in metric.values.items()):
            return i
    return None


# A line that may be a metric line with a NaN value (``parse_line`` decides).
_NAN_CANDIDATE = re.compile(r"^.*step:\d.*:(np\.float\d*\()?nan\b", re.M)


def _last_errors(text: _Text) -> list[Evidence]:
    """The last few lines that show an error, in the log's order."""
    found = text.matching(rules.ERROR_LINE, len(text.starts))
    return [text.evidence(i) for i in found[-MAX_EVIDENCE:]]


def _memory_hint(evidence: list[Evidence]) -> str:
    if any(_ROLLOUT_LINE.search(e.line) for e in evidence):
        return f"give {rules.ROLLOUT_MEMORY}"
    return (
        f"give the group that ran out more room; for {rules.TRAINER_MEMORY}; "
        f"for {rules.ROLLOUT_MEMORY}"
    )


def of_class(cls: str, summary: str, evidence: list[Evidence]) -> Failure:
    """A failure of ``cls`` found from another source than the log (Ray's state API), with the
    class's hint."""
    return Failure(cls, summary, rules.rule(cls).hint, evidence)
