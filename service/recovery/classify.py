"""Why a run failed, read from its log and Ray's word on the job: a class, a one-line summary,
the decisive lines with their offsets in the kept log, and a hint of what to change.

A log usually holds a cause and then its echoes (an actor that ran out of memory, then "the
actor died"), so the classes come in two tiers: causes (out of memory, a collective timing out,
a lost node, a missing file or module, a bad override, a shape that cannot be scheduled), of
which the earliest in the log wins, and effects (the async pipeline failing, an actor dying),
named only when no cause is found. A loss that turns NaN is read from verl's metric lines
(``metrics.parse``). A log with neither is ``unknown``, never a guess, its evidence the last
lines that show an error. The rules are ``recovery.rules``.

On a cluster other teams' jobs share, the log is not the run's own word: they run as the same
Unix user and can append to it. There the failure comes from what Ray and the kernel record
when they name a cause; a process Ray records ending with no error of its own, with no memory
evidence of theirs, is ``killed_outside``; any other class read from the log says it is the
log's claim.
"""

from __future__ import annotations

import bisect
import math
import re
from dataclasses import dataclass, field, replace
from typing import get_args

from service.metrics.ansi import strip_ansi
from service.metrics.parse import parse_line
from service.recovery import echoes, roots, rules
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
    exit_code: int | None = None,
    shared: bool = False,
) -> Failure:
    """The failure that ``log`` (starting at ``offset`` in the kept log), Ray's state API's
    lines on the job (``recovery.deaths``: a cause there outranks an effect in the log), Ray's
    error type and message and the driver's exit code show; ``shared``: other teams' jobs can
    write the log (``_checked``)."""
    found = _read(log, offset, ray_error_type, ray_message, ray_state)
    return _checked(found, ray_error_type, ray_message, ray_state, exit_code) if shared else found


# Ray's job message quotes the log's tail after this: the log's words, not Ray's.
_LOG_TAIL = "last available logs"
_CAUSE_CLASSES = frozenset(r.cls for r in rules.CAUSES)
_CLAIM = "the log's claim: other teams' jobs on this cluster can write that log"


def _checked(
    found: Failure,
    ray_error_type: str | None,
    ray_message: str,
    ray_state: str,
    exit_code: int | None,
) -> Failure:
    """``found`` (read from the log and Ray's word) held to what Ray and the kernel record: their
    cause if they name one; a death Ray records with no error of the run's own, killed from
    outside the run; otherwise ``found``, said to be the log's claim."""
    own = ray_message.split(_LOG_TAIL, 1)[0]
    checked = _read("", 0, ray_error_type, own, ray_state)
    said = f"{found.summary} ({found.cls})"
    if checked.cls in _CAUSE_CLASSES:
        if checked.cls == found.cls:
            return found
        return replace(checked, summary=f"{checked.summary}; {_CLAIM}, said {said}")
    state = _Text(ray_state, None)
    died = [state.evidence(i) for i in state.matching(rules.KILLED.pattern, MAX_EVIDENCE)]
    signal = rules.exit_signal(exit_code)
    if signal is not None:
        died.insert(0, Evidence(None, f"Ray: the job's driver exited with code {exit_code}"))
    if died:
        summary = rules.KILLED.summary
        if found.cls != "unknown":
            summary += f"; {_CLAIM}, said {said}"
        return Failure(rules.KILLED.cls, summary, rules.KILLED.hint, died[:MAX_EVIDENCE])
    if found.cls in (checked.cls, "unknown"):  # Ray's word says as much
        return found
    return replace(found, summary=f"{found.summary} ({_CLAIM})")


def _read(
    log: str,
    offset: int,
    ray_error_type: str | None,
    ray_message: str,
    ray_state: str,
) -> Failure:
    lines, state = _Text(log, offset), _Text(ray_state, None)
    found = _first_cause(lines) or _first_cause(state) or _effect(lines) or _effect(state)
    message = _Text(ray_message, None)
    if found is None and ray_message:
        found = _first_cause(message) or _effect(message)
    if found is None and ray_error_type in rules.RAY_ERRORS:
        rule = rules.rule(rules.RAY_ERRORS[ray_error_type])
        return Failure(rule.cls, f"{rule.summary} (Ray: {ray_error_type})", rule.hint)
    root = lines.root or message.root
    if found is None:
        last = _last_errors(lines) or _last_errors(message)
        if root is None:
            return Failure("unknown", "no known cause in the log", _UNKNOWN_HINT, last)
        said = _said(root)
        evidence = _root_first(lines if lines.root else message, last)
        return Failure("unknown", f"no known cause in the log; it ends in {said}",
                       _keys_hint(root, _UNKNOWN_HINT), evidence)  # fmt: skip
    rule, evidence = found
    hint = _memory_hint(evidence) if rule.cls == "npu_oom" else rule.hint
    if rule is rules.REFUSED:
        refused = next(t.root for t in (lines, state, message) if t.root and rules.refused(t.root))
        said = _said(refused)
        return Failure(rule.cls, f"{rule.summary}: {said}", _keys_hint(refused, hint), evidence)
    if root is None or rule.cls not in rules.ECHOED:
        # a cause's own lines (an exception's line first, ``_first_cause``); a frame or its
        # code says where, not what: after any line that says what
        evidence = sorted(evidence, key=lambda e: roots.in_traceback(e.line))
        own = (
            roots.raised(evidence[0].line) if evidence and rule.cls not in rules.OWN_WORD else None
        )
        summary = f"{rule.summary}: {_said(own)}" if own is not None else rule.summary
        return Failure(rule.cls, summary, hint, evidence)
    evidence = _root_first(lines if lines.root else message, evidence)
    if rule.cls in rules.ECHOED:  # the pipeline or an actor failing: the root says why
        summary = rule.summary
        if rule.cls == "actor_died" and lines.matching(rules.SIGNALLED, 1):
            summary = rules.SIGNALLED_SUMMARY
        return Failure(rule.cls, f"{summary}: {_said(root)}", hint, evidence)
    return Failure(rule.cls, rule.summary, hint, evidence)


_UNKNOWN_HINT = "the evidence holds the log's last error lines; the lines above them, the cause"
MAX_SAID = 200
_TRACEBACK = "Traceback (most recent call last)"


def _said(root: roots.Raised) -> str:
    said = f"{root.type}: {root.message}" if root.message else root.type
    return said if len(said) <= MAX_SAID else said[: MAX_SAID - 3] + "..."


def _keys_hint(root: roots.Raised, otherwise: str) -> str:
    """What to change, when the exception's message names configuration keys."""
    keys = rules.keys_named(root.message)
    if not keys:
        return otherwise
    return f"change {' / '.join(keys)} (named by the error); {otherwise}"


def _root_first(text: _Text, evidence: list[Evidence]) -> list[Evidence]:
    """The root exception's own line first, then the other evidence that is no traceback
    body (a frame or its code says where, not what), at most ``MAX_EVIDENCE`` lines."""
    assert text.root is not None
    first = text.evidence(text.root.line)
    rest = [
        e
        for e in evidence
        if e.line != first.line and not roots.in_traceback(e.line) and _TRACEBACK not in e.line
    ]
    return [first, *rest][:MAX_EVIDENCE]


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
        every = [self.line(i) for i in range(len(self.starts))]
        if "CancelledError" in text:  # tasks cancelled because something else failed
            self.skipped |= echoes.cancelled(every)
        self.root = roots.root(every, self.skipped)

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

    def raised(self, i: int) -> bool:
        """Whether line ``i`` is an exception's own line (not Ray's wrapper of one)."""
        return roots.own_line(self.line(i))

    def raised_after(self, i: int) -> int | None:
        """The first exception's own line from line ``i`` on, within a traceback's reach."""
        for j in range(i, min(i + roots.MAX_REPORT, len(self.starts))):
            if j not in self.skipped and self.raised(j):
                return j
        return None

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
    # verl refusing its configuration at start-up, whatever wrapped the refusal: nothing ran,
    # so no line before it is the cause.
    if text.root is not None and rules.refused(text.root):
        best = (False, -1, rules.REFUSED, [text.root.line])
    if best is None:
        return None
    rule, found = best[2], best[3]
    if rule.cls not in rules.OWN_WORD and not text.raised(found[0]):
        # a frame, the code that raised or Ray's wrapper matched: the exception's own line
        # below it first
        own = text.raised_after(found[0])
        if own is not None:
            found = [own, *(i for i in found if i != own)][:MAX_EVIDENCE]
    return rule, [text.evidence(i) for i in found]


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
    # not a warning's line: verl warns of each optional engine it cannot import
    found = [i for i in found if _WARNED not in text.line(i)]
    return [text.evidence(i) for i in found[-MAX_EVIDENCE:]]


_WARNED = "Warning: "


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
