"""A run's rollout samples: stored from the framed lines of its job log, bounded, paged.

The job ships each kept step as framed lines (``jobs.samples``); the follower hands them here.
Every line is checked again (``jobs.samples.read_sample``: a job can print anything): a bad one
is skipped and counted on the run. What one run holds is bounded: a step keeps at most
``per_step`` samples, a run at most ``per_run`` samples and ``chars_per_run`` characters; past
either, old steps are thinned (every second one of the older steps goes, and again while still
over), never the newest. Text fields are cut at ``jobs.samples.FIELD_CHARS`` with the cut named.
Each step's count and scores are kept beside its samples (``RunSampleStep``), in the same
transaction, so the per-step scores read a row a step.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import delete, func, insert, or_, select
from sqlalchemy.orm import Session

from jobs import samples as frame
from service.store.models import RunLog, RunSample, RunSampleStep

PAGE_MAX = 500


@dataclass(frozen=True)
class Bounds:
    per_step: int = 1024
    per_run: int = 100_000
    chars_per_run: int = 64_000_000


@dataclass(frozen=True)
class Parsed:
    """What a read of the log carried: samples in order, and lines skipped by reason."""

    samples: list[dict[str, Any]]
    skipped: dict[str, int]


def parse(lines: Sequence[str]) -> Parsed:
    samples: list[dict[str, Any]] = []
    skipped: dict[str, int] = {}
    for line in lines:
        got = frame.parse_frame(line)
        if got is None:
            continue
        if isinstance(got, str):
            skipped[got] = skipped.get(got, 0) + 1
        elif "skipped" in got:  # the job's own count of lines it could not read
            for reason, n in got["skipped"].items():
                skipped[reason] = skipped.get(reason, 0) + n
        else:
            samples.append(got)
    return Parsed(samples, skipped)


def is_frame(line: str) -> bool:
    return frame.PREFIX in line and frame.frame_body(line) is not None


def prompt_id(text: str) -> str:
    """The same id for the same prompt text, at every step and in every run."""
    return hashlib.sha256(text.encode("utf-8", "replace")).hexdigest()[:16]


def ingest(session: Session, runlog: RunLog, parsed: Parsed, bounds: Bounds) -> int:
    """Store ``parsed`` for ``runlog``'s run within ``bounds``; returns the rows stored. Flushes."""
    skipped = sum(parsed.skipped.values())
    if skipped:
        runlog.samples_skipped += skipped
    if not parsed.samples:
        return 0
    held = {
        row.step: row
        for row in session.scalars(
            select(RunSampleStep).where(
                RunSampleStep.run_id == runlog.run_id,
                RunSampleStep.step.in_({s["step"] for s in parsed.samples}),
            )
        )
    }
    rows: list[dict[str, Any]] = []
    chars = 0
    for s in parsed.samples:
        if not _count_in(session, held, runlog.run_id, s, bounds.per_step):
            runlog.samples_skipped += 1
            continue
        size = len(s["input"]) + len(s["output"]) + len(s["gts"]) + len(str(s["extras"]))
        chars += size
        rows.append(
            {
                "run_id": runlog.run_id,
                "step": s["step"],
                "prompt_id": prompt_id(s["input"]),
                "score": s["score"],
                "input": s["input"],
                "output": s["output"],
                "gts": s["gts"],
                "extras": s["extras"],
                "cut": ",".join(s["cut"])[:400],
                "of": s.get("of"),
                "chars": size,
            }
        )
    if rows:
        session.execute(insert(RunSample), rows)
        runlog.samples_kept += len(rows)
        runlog.samples_chars += chars
        thin(session, runlog, bounds)
    session.flush()
    return len(rows)


def _count_in(
    session: Session,
    held: dict[int, RunSampleStep],
    run_id: str,
    sample: dict[str, Any],
    per_step: int,
) -> bool:
    """Count ``sample`` in its step's row (made on its first sample), unless the step is full."""
    step, score, of = sample["step"], sample["score"], sample.get("of")
    row = held.get(step)
    if row is None:
        row = held[step] = RunSampleStep(
            run_id=run_id, step=step, count=0, score_sum=0.0, min_score=score, max_score=score
        )
        session.add(row)
    if row.count >= per_step:
        return False
    row.count += 1
    row.score_sum += score
    row.min_score, row.max_score = min(row.min_score, score), max(row.max_score, score)
    if of is not None:
        row.of = of if row.of is None else max(row.of, of)
    return True


def thin(session: Session, runlog: RunLog, bounds: Bounds) -> None:
    """While the run holds more than its bounds: drop every second step of those older than
    the newest (the oldest of them kept), and the oldest alone when only it is left."""
    while runlog.samples_kept > bounds.per_run or runlog.samples_chars > bounds.chars_per_run:
        session.flush()  # the steps' rows as the ingest left them
        steps = list(
            session.scalars(
                select(RunSampleStep.step)
                .where(RunSampleStep.run_id == runlog.run_id)
                .order_by(RunSampleStep.step)
            )
        )[:-1]  # never the newest
        if not steps:
            return
        drop = steps[1::2] or steps[:1]
        for n in range(0, len(drop), 500):
            part = drop[n : n + 500]
            count, chars = session.execute(
                select(func.count(), func.coalesce(func.sum(RunSample.chars), 0)).where(
                    RunSample.run_id == runlog.run_id, RunSample.step.in_(part)
                )
            ).one()
            for table in (RunSample, RunSampleStep):
                session.execute(
                    delete(table).where(table.run_id == runlog.run_id, table.step.in_(part))
                )
            runlog.samples_kept -= int(count)
            runlog.samples_chars -= int(chars)


@dataclass(frozen=True)
class Query:
    step: int | None = None
    min_score: float | None = None
    max_score: float | None = None
    q: str | None = None
    prompt_id: str | None = None
    cursor: int | None = None
    limit: int = 50


# What a page shows of a sample (``wire.metrics.sample_doc``): plain rows, no ORM objects to build.
PAGE_COLUMNS = (
    RunSample.id,
    RunSample.step,
    RunSample.prompt_id,
    RunSample.score,
    RunSample.input,
    RunSample.output,
    RunSample.gts,
    RunSample.extras,
    RunSample.cut,
    RunSample.of,
)


def page(session: Session, run_id: str, query: Query) -> tuple[list[Any], int | None]:
    """A page of the run's samples (rows of ``PAGE_COLUMNS``), newest first, and the cursor of
    the next page."""
    stmt = select(*PAGE_COLUMNS).where(RunSample.run_id == run_id)
    if query.step is not None:
        stmt = stmt.where(RunSample.step == query.step)
    if query.prompt_id is not None:
        stmt = stmt.where(RunSample.prompt_id == query.prompt_id)
    if query.min_score is not None:
        stmt = stmt.where(RunSample.score >= query.min_score)
    if query.max_score is not None:
        stmt = stmt.where(RunSample.score <= query.max_score)
    if query.q:
        like = "%" + query.q.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
        stmt = stmt.where(
            or_(
                RunSample.input.ilike(like, escape="\\"),
                RunSample.output.ilike(like, escape="\\"),
            )
        )
    if query.cursor is not None:
        stmt = stmt.where(RunSample.id < query.cursor)
    rows = list(session.execute(stmt.order_by(RunSample.id.desc()).limit(query.limit + 1)))
    more = len(rows) > query.limit
    rows = rows[: query.limit]
    return rows, (rows[-1].id if more and rows else None)


def steps(session: Session, run_id: str) -> list[dict[str, Any]]:
    """Per step held: samples, mean/min/max score, and how many the job's file had (the rows the
    ingest keeps, ``RunSampleStep``)."""
    return [
        {"step": s, "count": n, "mean": total / n, "min": lo, "max": hi, "of": of}
        for s, n, total, lo, hi, of in session.execute(
            select(
                RunSampleStep.step,
                RunSampleStep.count,
                RunSampleStep.score_sum,
                RunSampleStep.min_score,
                RunSampleStep.max_score,
                RunSampleStep.of,
            )
            .where(RunSampleStep.run_id == run_id, RunSampleStep.count > 0)
            .order_by(RunSampleStep.step)
        )
    ]


def counters(session: Session, run_id: str) -> tuple[int, int, int]:
    """Samples kept, characters stored, lines skipped."""
    got = session.execute(
        select(RunLog.samples_kept, RunLog.samples_chars, RunLog.samples_skipped).where(
            RunLog.run_id == run_id
        )
    ).first()
    return (int(got[0]), int(got[1]), int(got[2])) if got else (0, 0, 0)
