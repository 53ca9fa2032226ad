"""How the follower reads a job log past an offset: Ray's tail stream, or the whole log.

``TailReader`` (the service's) keeps one ``LogTail`` per followed run, so each read costs only
what is new; the text read but not yet stored stays with it until the follower says it is. Its
final read of an ended run checks the whole log once, for lines the stream never sent.
``WholeLogReader`` fetches the whole log and drops the known prefix: simple, and costly for a
long log (it is what tests with a stand-in for Ray use, and the benchmark's baseline).
"""

from __future__ import annotations

from collections.abc import Set
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from service.cluster.log_tail import LogTail
from service.cluster.ray_jobs import RayJobs


class LogReader(Protocol):
    def read(self, run_id: str, offset: int, ended_at: datetime | None) -> tuple[str | None, bool]:
        """The log past ``offset`` (None: Ray does not know the job), and whether that is all
        of it: the run ended (it was seen ended at ``ended_at``) and nothing more will come."""
        ...

    def consumed(self, run_id: str, offset: int) -> None:
        """The log up to ``offset`` is stored: it will not be asked for again."""
        ...

    def retain(self, run_ids: Set[str]) -> None:
        """Stop following every run but these."""
        ...


class WholeLogReader:
    def __init__(self, ray: RayJobs) -> None:
        self.ray = ray

    def read(self, run_id: str, offset: int, ended_at: datetime | None) -> tuple[str | None, bool]:
        text = self.ray.logs(run_id)
        return (None if text is None else text[offset:]), ended_at is not None

    def consumed(self, run_id: str, offset: int) -> None:
        pass

    def retain(self, run_ids: Set[str]) -> None:
        pass


@dataclass
class _Followed:
    tail: LogTail
    start: int  # the log offset where ``pending`` starts
    pending: str = ""


class TailReader:
    def __init__(self, ray: RayJobs) -> None:
        self.ray = ray
        self._runs: dict[str, _Followed] = {}

    def read(self, run_id: str, offset: int, ended_at: datetime | None) -> tuple[str | None, bool]:
        run = self._runs.get(run_id)
        if run is None or run.start != offset:  # new, or another replica read on meanwhile
            if run is not None:
                run.tail.close()
            run = self._runs[run_id] = _Followed(self.ray.tail(run_id, offset), offset)
        # Asked before taking: when the stream had ended, the take holds all of the rest.
        complete = ended_at is not None and run.tail.complete_since(ended_at)
        run.pending += run.tail.take()
        if complete:
            # Ray may end a tail stream before it has sent the last lines (ray issue 57002):
            # the final read of an ended run takes the rest from the whole log, once.
            whole = self.ray.logs(run_id)
            if whole is not None and len(whole) - offset > len(run.pending):
                run.pending = whole[offset:]
        if run.tail.missing and not run.pending:
            return None, complete
        return run.pending, complete

    def consumed(self, run_id: str, offset: int) -> None:
        run = self._runs.get(run_id)
        if run is not None:
            run.pending = run.pending[offset - run.start :]
            run.start = offset

    def retain(self, run_ids: Set[str]) -> None:
        for run_id in set(self._runs) - set(run_ids):
            self._runs.pop(run_id).tail.close()
