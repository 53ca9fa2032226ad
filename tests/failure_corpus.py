"""The failure corpus: real log excerpts from public reports, each labelled with the class a
careful engineer gives it, split by source thread into the set the rules are written on
(``tests/data/failures/*.log``) and a held-out set they are measured on
(``tests/data/failures/held_out/*.log``). ``tests/data/failures/README.md`` says how an
excerpt is written and where a new one goes.
"""

from __future__ import annotations

import gzip
import hashlib
import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from service.recovery.classify import classify

ROOT = Path(__file__).resolve().parent / "data" / "failures"
RULE_SET = ROOT
HELD_OUT = ROOT / "held_out"
# Whole console logs of real verl runs broken on purpose on this project's CPU stack, each
# named with its cause in the manifest; split by cause, not by file.
WHOLE = ROOT / "whole"
MANIFEST = WHOLE / "manifest.json"


@dataclass(frozen=True)
class Excerpt:
    path: Path
    source: str  # the thread's address (the header's first word)
    cls: str
    body: str


def load(where: Path) -> list[Excerpt]:
    """The excerpts in ``where``, each from its header (``# source: <url> [note]``,
    ``# class: <class>``) and the log lines below it."""
    out = []
    for path in sorted(where.glob("*.log")):
        text = path.read_text()
        meta: dict[str, str] = {}
        for line in text.splitlines():
            if line.startswith("# ") and ": " in line:
                key, value = line[2:].split(": ", 1)
                meta.setdefault(key, value)
        body = "".join(line for line in text.splitlines(keepends=True) if not line.startswith("# "))
        out.append(Excerpt(path, meta["source"].split()[0], meta["class"], body))
    return out


def held_out_by_hash(source: str) -> bool:
    """The side a new thread goes to: held out when the first byte of its address's SHA-256
    is below 128 (about half), whatever its content."""
    return hashlib.sha256(source.encode()).digest()[0] < 128


def side_of_cause(cause: str) -> str:
    """The side a cause's whole logs go to, fixed by its name before any rule is written for
    it: held out when the first byte of its SHA-256 is below 128."""
    return "held_out" if hashlib.sha256(cause.encode()).digest()[0] < 128 else "rules"


@dataclass(frozen=True)
class WholeLog:
    excerpt: Excerpt  # its cause as the source, its class, the whole log
    cause: str
    made: str  # what broke the run (overrides, a kill)
    side: str
    why: str = ""  # what the log says (its root exception, as a verl engineer reads it)


def load_whole(side: str | None = None) -> list[WholeLog]:
    """The whole logs of ``MANIFEST`` (gzip-compressed beside it), of one side or both."""
    out = []
    for entry in json.loads(MANIFEST.read_text())["logs"]:
        path = WHOLE / entry["file"]
        body = gzip.decompress(path.read_bytes()).decode()
        log = WholeLog(
            Excerpt(path, f"tests/verl_cpu_failures.sh#{entry['cause']}", entry["class"], body),
            entry["cause"],
            entry["made"],
            entry["side"],
            entry.get("why", ""),
        )
        if side is None or log.side == side:
            out.append(log)
    return out


@dataclass
class Score:
    right: Counter[str] = field(default_factory=Counter)
    wrong: Counter[str] = field(default_factory=Counter)
    unknown: Counter[str] = field(default_factory=Counter)
    misses: list[str] = field(default_factory=list)  # "file: expected -> got"

    @property
    def total(self) -> int:
        return sum(self.right.values()) + sum(self.wrong.values()) + sum(self.unknown.values())

    def share(self, counts: Counter[str]) -> float:
        return sum(counts.values()) / self.total if self.total else 0.0

    def classes(self) -> list[str]:
        return sorted(set(self.right) | set(self.wrong) | set(self.unknown))


def score(excerpts: list[Excerpt]) -> Score:
    """Each excerpt through the classifier, counted by its expected class."""
    result = Score()
    for excerpt in excerpts:
        got = classify(excerpt.body).cls
        if got == excerpt.cls:
            result.right[excerpt.cls] += 1
            continue
        (result.unknown if got == "unknown" else result.wrong)[excerpt.cls] += 1
        result.misses.append(f"{excerpt.path.name}: {excerpt.cls} -> {got}")
    return result
