"""The service's own bounded copy of each job log (it outlives the Ray head)."""

from __future__ import annotations

from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

from service.store.models import LogChunk


def append(session: Session, run_id: str, start: int, text: str, keep_chars: int) -> None:
    """Store ``text`` read at ``start``; drop whole chunks that fall before the kept tail."""
    if not text:
        return
    session.add(LogChunk(run_id=run_id, start_offset=start, text=text))
    end = start + len(text)
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
