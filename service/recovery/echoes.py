"""Lines of a log that echo a cancel, never evidence of a failure.

When one part of a run fails, its driver cancels the others (verl's fully async task runner
cancels the rollouter once the trainer dies), and each cancelled task reports itself with a
traceback that names the code it was in (``ray::AgentLoopWorker.generate_sequences()``,
frames in ``fully_async_policy``). Such a report ends in a cancellation
(``TaskCancelledError``, ``CancelledError``): what failed is whatever caused the cancel, so its
lines are skipped by the classifier like the autoscaler's.

A report is read per source (Ray's ``(Name pid=N)`` prefix of an actor's lines; the driver's
own lines have none): from a line that starts one (a traceback, "failed with exception:", a
chained exception's "During handling ...") to the exception it ends with. A chained report's
parts are judged each on its own: a cancel that led to a real error keeps that error's part.
"""

from __future__ import annotations

import re

from service.metrics.ansi import strip_ansi

# Ray's prefix of a line an actor or task printed: "(Name pid=N[, ip=...]) ".
_SOURCE = re.compile(r"\([\w.:-]+ pid=\d+[^)\n]*\) ?")
_STARTS = re.compile(
    r"Traceback \(most recent call last\)|failed with exception:"
    r"|During handling of the above exception|The above exception was the direct cause"
)
# The line a report ends with: the exception raised, at the start of its line.
_RAISED = re.compile(r"(?:[\w]+\.)*\w*(?:Error|Exception|Interrupt)\b(?:\([\w.]+\))?(?::|$)")
_CANCEL = re.compile(r"\b(?:Task)?CancelledError\b")
# A report longer than this without the exception it ends with is not read as one.
MAX_REPORT = 300


def cancelled(lines: list[str]) -> set[int]:
    """The indices of ``lines`` that belong to a report ending in a cancellation."""
    echoes: set[int] = set()
    open_: dict[str, list[int]] = {}  # source -> the lines of its report so far
    for i, raw in enumerate(lines):
        line = strip_ansi(raw).rstrip("\r\n")
        prefix = _SOURCE.match(line)
        source = prefix.group(0).strip() if prefix else ""
        content = line[prefix.end() :] if prefix else line
        report = open_.get(source)
        if report is None:
            if _RAISED.match(content) and _CANCEL.search(content):
                echoes.add(i)  # a cancellation said on one line
            if not _STARTS.search(content):
                continue
            report = open_[source] = []
        report.append(i)
        if _RAISED.match(content):
            if _CANCEL.search(content):
                echoes.update(report)
            del open_[source]
        elif len(report) > MAX_REPORT:
            del open_[source]
    return echoes
