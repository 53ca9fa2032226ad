"""The exception a log's failure comes down to, read as a verl engineer reads a traceback:
through Ray's wrapping to the exception's own line.

A failing verl run prints its error several times over: the actor that raised it, each Ray
task that waited on that actor (``ray.exceptions.RayTaskError(ValueError): ray::...`` and the
frames of the wrapping task), "The actor died because of an error raised in its creation
task", a chained cause ("The above exception was the direct cause of the following
exception"), and last the driver's traceback under Hydra's "Error executing job". Each of these
reports ends in the same exception's line, ``ValueError: ...``: that line, not a frame
(``File "...", line N, in <module>``), says what went wrong.

A report is read per source, as ``recovery.echoes`` reads them (Ray's ``(Name pid=N)`` prefix;
the driver's own lines have none). The run's root is the cause of the driver's last report (of
the last report, when the driver printed none): the first exception of a chain, the exception
inside Ray's wrapper, and, for an exception that says its cause was printed above (vLLM's
"Engine core initialization failed. See root cause above"), the report before it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence, Set
from dataclasses import dataclass, field

from service.metrics.ansi import strip_ansi

_SOURCE = re.compile(r"\([\w.:-]+ pid=\d+[^)\n]*\) ?")
_LOGGER = re.compile(r"(?:ERROR|WARNING|INFO|CRITICAL|DEBUG) \d\d-\d\d [\d:.]+ \[[^\]\n]+\] ")
_TRACEBACK = "Traceback (most recent call last)"
_CHAINED = re.compile(
    r"^(The above exception was the direct cause|During handling of the above exception)"
)
# An exception's line: its (qualified) name at the line's start, Ray's wrapped type in
# parentheses, and its message.
_RAISED = re.compile(
    r"^(?P<name>(?:[A-Za-z_]\w*\.)*(?P<type>[A-Za-z_]\w*(?:Error|Exception|Interrupt|Exit)))"
    r"(?:\((?P<inner>[\w.]+)\))?(?::\s?(?P<message>.*)|\s*$)"
)
_FRAME = re.compile(r'^\s*File "(?P<file>[^"\n]+)", line \d+, in (?P<function>\S+)')
# Ray's wrappers: what they say is the inner exception's, printed below them.
_WRAPPERS = {"RayTaskError", "RayActorError", "ActorDiedError"}
_CREATION = "error raised in its creation task"
_CREATION_SAID = "Exception raised in creation task:"
_SEE_ABOVE = re.compile(r"(?i)root cause above|see (the )?(error|logs?) above")
# The code under a frame: a statement that raises, returns or calls.
_CODE = re.compile(r"^\s+(?:(?:raise|return|await|assert|yield)\b|[\w.\[\]]+ = |.*\($)")
# Lines a report may hold without a frame: code, carets, a long message's continuation.
MAX_REPORT = 400


@dataclass(frozen=True)
class Raised:
    """An exception's own line in a log and what the traceback above it says of it."""

    line: int  # its index among the log's lines
    name: str  # as printed (``torch.distributed.DistNetworkError``)
    type: str  # unqualified (``DistNetworkError``)
    message: str
    frames: tuple[tuple[str, str], ...] = ()  # (file, function) of its part, innermost last
    creation: bool = False  # raised in an actor's creation task (Ray said so)

    @property
    def innermost(self) -> tuple[str, str] | None:
        return self.frames[-1] if self.frames else None


@dataclass
class _Report:
    parts: list[Raised] = field(default_factory=list)
    frames: list[tuple[str, str]] = field(default_factory=list)
    creation: bool = False
    lines: int = 0
    ended: bool = False


def parse(line: str) -> tuple[str, str]:
    """(source, content) of a log line: Ray's prefixes (an actor's, and a process's inside it:
    ``(vLLMHttpServer pid=1) (Worker_TP1 pid=2)``) and vLLM's logger's (``ERROR 03-04
    05:42:52 [multiproc_executor.py:824]``, which prints a traceback line by line), and what
    follows them."""
    text = strip_ansi(line).rstrip("\r\n")
    source, at = "", 0
    while prefix := _SOURCE.match(text, at) or _LOGGER.match(text, at):
        if prefix.re is _SOURCE:
            source += prefix.group(0).strip()
        at = prefix.end()
    return source, text[at:]


def raised_line(content: str) -> re.Match[str] | None:
    return _RAISED.match(content)


def own_line(line: str) -> bool:
    """An exception's own line: not Ray's wrapper of another (``RayTaskError(X): ...``, an
    error raised in a creation task), whose own line is printed below it."""
    content = parse(line)[1]
    match = raised_line(content)
    if match is None:
        return False
    return match.group("type") not in _WRAPPERS or not (
        match.group("inner") or _CREATION in content
    )


def raised(line: str) -> Raised | None:
    """The exception ``line`` is the own line of, if it is one (its place unknown: 0)."""
    if not own_line(line):
        return None
    match = raised_line(parse(line)[1])
    assert match is not None
    return Raised(
        0, match.group("name"), match.group("type"), (match.group("message") or "").strip()
    )


def is_frame(line: str) -> bool:
    """A traceback's frame line (``File "...", line N, in f``), never evidence on its own."""
    return _FRAME.match(parse(line)[1]) is not None


def in_traceback(line: str) -> bool:
    """A traceback's frame line or the code printed under one, which say where, not what."""
    content = parse(line)[1]
    return _FRAME.match(content) is not None or _CODE.match(content) is not None


def reports(lines: Sequence[str], skipped: Set[int] = frozenset()) -> list[tuple[str, Raised]]:
    """Each report's cause, with its source, in the order the reports end."""
    out: list[tuple[str, Raised]] = []
    open_: dict[str, _Report] = {}
    for i, raw in enumerate(lines):
        if i in skipped:
            continue
        source, content = parse(raw)
        report = open_.get(source)
        if content.startswith(_TRACEBACK):
            if report is None or report.ended or not report.parts:
                report = open_[source] = _Report()
            report.frames, report.ended = [], False
            continue
        if _CHAINED.match(content) and report is not None:
            report.ended = False  # the next part is chained to the parts before it
            continue
        if content.startswith(_CREATION_SAID):  # an actor's own word on its creation task
            report = open_[source] = _Report(creation=True)
            continue
        if report is None:
            match = raised_line(content)
            if match is None or match.group("type") not in _WRAPPERS:
                continue
            report = open_[source] = _Report()  # Ray's wrapper opens its own report
        if report.ended:
            if content.strip():
                # a line after a part: a chained part follows only after Python's words
                match = raised_line(content)
                if match is None or match.group("type") not in _WRAPPERS:
                    del open_[source]
                    continue
                report = open_[source] = _Report()
            else:
                continue
        report.lines += 1
        if frame := _FRAME.match(content):
            report.frames.append((frame.group("file"), frame.group("function")))
            continue
        match = raised_line(content)
        if match is None:
            if report.lines > MAX_REPORT:
                del open_[source]
            continue
        if match.group("type") in _WRAPPERS and (
            match.group("inner") or _CREATION in content or not report.parts
        ):
            # Ray's wrapper: the frames and the exception below it are the inner one's.
            report.creation = report.creation or _CREATION in content
            if match.group("inner") or _CREATION in content:
                report.frames = []
                continue
        part = Raised(
            i,
            match.group("name"),
            match.group("type"),
            (match.group("message") or "").strip(),
            tuple(report.frames),
            report.creation,
        )
        report.parts.append(part)
        report.ended, report.frames = True, []
        out.append((source, report.parts[0]))
    return out


def root(lines: Sequence[str], skipped: Set[int] = frozenset()) -> Raised | None:
    """The exception the log's failure comes down to (None: no traceback ends in one)."""
    found = reports(lines, skipped)
    if not found:
        return _alone(lines, skipped)
    driver = [i for i, (source, _) in enumerate(found) if source == ""]
    at = driver[-1] if driver else len(found) - 1
    while at > 0 and _SEE_ABOVE.search(found[at][1].message):
        at -= 1  # its cause was printed in the report before it
    return found[at][1]


def _alone(lines: Sequence[str], skipped: Set[int]) -> Raised | None:
    """The last exception's line printed with no traceback read above it (a log cut short
    above it), Ray's wrappers aside."""
    for i in range(len(lines) - 1, -1, -1):
        if i in skipped:
            continue
        match = raised_line(parse(lines[i])[1])
        if match and match.group("message") and match.group("type") not in _WRAPPERS:
            return Raised(i, match.group("name"), match.group("type"), match.group("message"))
    return None
