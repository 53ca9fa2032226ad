"""The service's own bounded copy of each job log (it outlives the Ray head)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import bindparam, delete, func, select
from sqlalchemy.orm import Session

from service.store.models import LogChunk, Run, RunLog
from service.store.status import TERMINAL


def append(session: Session, run_id: str, start: int, text: str, keep_chars: int) -> None:
    """Store ``text`` read at ``start``; drop whole chunks that fall before the kept tail."""
    if not text:
        return
    session.add(LogChunk(run_id=run_id, start_offset=start, text=text))
    end = start + len(text)
    if end <= keep_chars:
        return  # the whole log is within the kept tail: nothing to drop
    session.execute(
        delete(LogChunk).where(
            LogChunk.run_id == run_id,
            LogChunk.start_offset + func.length(LogChunk.text) <= end - keep_chars,
        )
    )
    session.flush()


def append_parts(
    session: Session, run_id: str, parts: list[tuple[int, str]], end: int, keep_chars: int
) -> None:
    """Store the pieces ``parts`` (each at its own log offset; what lies between them is kept
    elsewhere, e.g. rollout samples) of a read that ends at ``end``."""
    for start, text in parts:
        if text:
            session.add(LogChunk(run_id=run_id, start_offset=start, text=text))
    if end <= keep_chars:
        return
    session.execute(
        delete(LogChunk).where(
            LogChunk.run_id == run_id,
            LogChunk.start_offset + func.length(LogChunk.text) <= end - keep_chars,
        )
    )
    session.flush()


def tail(session: Session, run_id: str, lines: int | None) -> str:
    """The last ``lines`` lines of the kept copy (all of it when ``lines`` is None)."""
    parts: list[str] = []
    newlines = 0
    for text in session.scalars(
        select(LogChunk.text)
        .where(LogChunk.run_id == run_id)
        .order_by(LogChunk.start_offset.desc())
        .execution_options(yield_per=64)
    ):
        parts.append(text)
        newlines += text.count("\n")
        if lines is not None and newlines > lines:
            break
    copy = "".join(reversed(parts))
    if lines is None:
        return copy
    kept = copy.splitlines(keepends=True)
    return "".join(kept[-lines:]) if lines else ""


def since(session: Session, run_id: str, offset: int) -> tuple[str, int]:
    """What the kept copy holds after log offset ``offset``, and the offset where it ends."""
    chunks = session.execute(
        select(LogChunk.start_offset, LogChunk.text)
        .where(
            LogChunk.run_id == run_id,
            LogChunk.start_offset + func.length(LogChunk.text) > offset,
        )
        .order_by(LogChunk.start_offset)
    ).all()
    if not chunks:
        return "", max(offset, end(session, run_id))
    first_start = chunks[0][0]
    text = "".join(t for _, t in chunks)[max(0, offset - first_start) :]
    return text, chunks[-1][0] + len(chunks[-1][1])


def end(session: Session, run_id: str) -> int:
    """The log offset just past the kept copy (0 before any output)."""
    last = session.execute(
        select(LogChunk.start_offset, func.length(LogChunk.text))
        .where(LogChunk.run_id == run_id)
        .order_by(LogChunk.start_offset.desc())
        .limit(1)
    ).first()
    return int(last[0] + last[1]) if last else 0


# What tells whether a run is ``finished`` (parameter ``run_id``).
ENDED = (
    select(Run.status, Run.submitted_at, RunLog.finished_at)
    .outerjoin(RunLog, RunLog.run_id == Run.id)
    .where(Run.id == bindparam("run_id"))
)


def finished(session: Session, run_id: str) -> bool:
    """The run has ended and its log has been read to the end: nothing more will be added."""
    return read_to_end(*session.execute(ENDED, {"run_id": run_id}).one())


def read_to_end(status: str, submitted_at: datetime | None, finished_at: datetime | None) -> bool:
    """``finished``, from the row ``ENDED`` reads."""
    if status not in TERMINAL:
        return False
    # A run that never reached Ray has no log to wait for.
    return submitted_at is None or finished_at is not None
