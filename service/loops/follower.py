"""The log follower: reads each active run's Ray job log from its own offset.

It reads through a ``LogReader``: Ray's log tail stream, kept open per run, so a read costs what
the new lines cost however long the log grows. It takes only complete lines. Each tick reads
every held run first, then stores, in one transaction per batch of runs (their rows locked in one
query), each run's text (the service's copy), metric points, new offset (``run_logs.log_offset``)
and ``runs.last_output_at``: a restart resumes exactly where the last commit ended, with no gap
and no duplicate. Each run's follower is held by one replica through a
lease in ``run_logs`` that another replica takes over when it lapses. After a run ends and the
reader has the whole log, one final read takes the rest (even an unterminated last line) and
the run's follower is finished; a job Ray reports SUCCEEDED ends its run only then
(``recovery.ending``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence, Set
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import and_, exists, or_, select, update
from sqlalchemy.orm import Session

from jobs import resume
from service.cluster.ray_jobs import RayJobs, RayRejected, RayUnavailable
from service.cluster.registry import Clusters, UnknownCluster
from service.metrics import logcopy, resumed, samples, startup, store, targets, weight_sync
from service.metrics.health import HealthRules, evaluate
from service.metrics.keys import STEP_KEY, TRAINER_STEP_KEY
from service.metrics.log_readers import LogReader, TailReader
from service.metrics.parse import (
    MetricLine,
    WeightDigest,
    awaiting_rest,
    parse_checkpoint,
    parse_lines,
    parse_preflight,
    parse_weights,
)
from service.notify import thresholds
from service.recovery import attempts, deaths, ending, retry
from service.recovery.retry import RetryConfig
from service.store.db import Database
from service.store.dialect import dialect_insert
from service.store.lifecycle import checkpoint_saved, note, yield_settled
from service.store.models import Run, RunEvent, RunLog, Webhook, utcnow
from service.store.status import ENDED, RunStatus

log = logging.getLogger(__name__)
_LONG_AGO = datetime.min.replace(tzinfo=UTC)
# Ray may report a job ended before its last lines are in the job log: the final read of a run
# waits this long after the run was seen ended.
FINAL_READ_AFTER = timedelta(seconds=2)
# An ended attempt whose log Ray has not given to its end this long after the end (Ray
# unreachable, its cluster down, its log stream stuck) is decided on the log kept so far, and the
# run's events and failure say so: a run never waits on Ray for its retry decision forever.
DECIDE_WITHIN = timedelta(seconds=120)
# A live run's step line whose rest may be still to come (``parse.awaiting_rest``) is left to
# the next read for this long at most; then it is taken as it is.
AWAIT_REST_S = 10.0
_FAILED = frozenset({RunStatus.FAILED, RunStatus.LOST, RunStatus.RETRYING})


@dataclass(frozen=True)
class Held:
    run_id: str
    status: RunStatus
    offset: int
    ended_at: datetime | None = None
    # When Ray was seen reporting the job SUCCEEDED, the run not yet ended (recovery.ending).
    ray_ended_at: datetime | None = None
    attempt: int = 1
    base: int = 0  # where the current attempt's job log starts in the kept copy
    cluster: str | None = None  # where the job is (None: the primary cluster)

    @property
    def job(self) -> str:
        return attempts.job_id(self.run_id, self.attempt)


@dataclass(frozen=True)
class _Read:
    held: Held
    new: str  # the text to store
    parsed: list[tuple[int, MetricLine]]
    reports: list[dict[str, Any]]
    final: bool
    # For a failed run's final read: what Ray's state API says died under its job.
    ray_state: list[str] = field(default_factory=list)
    resumed: int | None = None  # the step the job said it resumes from
    # The complete checkpoints the job reported: (end offset of the line, step).
    saves: list[tuple[int, int]] = field(default_factory=list)
    # A final read made without the log's end (``DECIDE_WITHIN``): why.
    cut_short: str | None = None
    marks: list[str] = field(default_factory=list)  # start-up marks (``metrics.startup``)
    # Rollout samples the lines framed, and the rest of the text in pieces at their offsets
    # (the kept log copy holds no sample).
    samples: samples.Parsed = field(default_factory=lambda: samples.Parsed([], {}))
    parts: list[tuple[int, str]] = field(default_factory=list)
    # Each side's digest of a weight sync (``metrics.weight_sync``).
    weights: list[WeightDigest] = field(default_factory=list)


def log_parts(lines: list[tuple[int, str]]) -> list[tuple[int, str]]:
    """The text of ``lines`` (each with its end offset) without framed sample lines, in
    contiguous pieces at their own offsets."""
    parts: list[tuple[int, str]] = []
    for end, line in lines:
        if samples.is_frame(line):
            continue
        start = end - len(line)
        if parts and parts[-1][0] + len(parts[-1][1]) == start:
            parts[-1] = (parts[-1][0], parts[-1][1] + line)
        else:
            parts.append((start, line))
    return parts


def split_lines(text: str, start: int, final: bool) -> tuple[str, list[tuple[int, str]]]:
    """The consumable part of ``text`` (read at ``start``) and its lines with end offsets."""
    if not final:
        text = text[: text.rfind("\n") + 1]
    lines: list[tuple[int, str]] = []
    pos = start
    for line in text.splitlines(keepends=True):
        pos += len(line)
        lines.append((pos, line))
    return text, lines


class ByCluster:
    """A log reader per cluster (Ray's tail stream on each), each job read on its run's."""

    def __init__(self, clusters: Clusters, where: dict[str, str | None]) -> None:
        self.clusters = clusters
        self.where = where  # job -> its run's cluster, kept by the follower
        self._readers: dict[str, TailReader] = {}

    def _of(self, job: str) -> TailReader:
        handle = self.clusters.of(self.where.get(job))
        if handle.name not in self._readers:
            self._readers[handle.name] = TailReader(handle.ray)
        return self._readers[handle.name]

    def read(self, run_id: str, offset: int, ended_at: datetime | None) -> tuple[str | None, bool]:
        return self._of(run_id).read(run_id, offset, ended_at)

    def consumed(self, run_id: str, offset: int) -> None:
        self._of(run_id).consumed(run_id, offset)

    def retain(self, run_ids: Set[str]) -> None:
        for name, reader in self._readers.items():
            reader.retain({j for j in run_ids if self.clusters.of(self.where.get(j)).name == name})


@dataclass
class Follower:
    db: Database
    ray: RayJobs | Clusters  # a lone client: the one ``default`` cluster
    owner: str
    lease_s: float
    keep_chars: int
    rules: HealthRules
    notify: Callable[[str], None] = lambda _run_id: None
    # Called after a batch in which this follower ended a run (a success Ray reported).
    on_end: Callable[[], None] = lambda: None
    # The operator's side of retry policies; ``on_retry`` is called after a round that started
    # a next attempt (the submitter may admit it now).
    retry: RetryConfig = field(default_factory=RetryConfig)
    on_retry: Callable[[], None] = lambda: None
    # Called after a batch that recorded a checkpoint (a run yielding for it may stop now).
    on_checkpoint: Callable[[], None] = lambda: None
    # How long after an attempt's end its log is waited for before the decision is made on the
    # part kept (``DECIDE_WITHIN``).
    decide_within: timedelta = DECIDE_WITHIN
    # How long a live run's step line whose rest may be still to come is left to the next read.
    await_rest_s: float = AWAIT_REST_S
    # How long a run that reached its target (``stop_when``) waits for its next checkpoint.
    target_within_s: float = 1800.0
    # How the job log is read: by default Ray's tail stream of the run's cluster, kept open
    # per run.
    reader: LogReader | None = None
    # What one run may store (keys and points); the rest is dropped with a note.
    limits: store.Limits = field(default_factory=store.Limits)
    # What one run may hold of rollout samples (``metrics.samples``).
    sample_bounds: samples.Bounds = field(default_factory=samples.Bounds)
    # Runs stored per transaction; runs that no replica holds taken per tick.
    batch: int = 50
    claim_new: int = 100
    # For /metrics: points this replica stored, and when each run it holds was last read.
    points_ingested: int = field(default=0, init=False)
    last_read: dict[str, float] = field(default_factory=dict, init=False)
    clusters: Clusters = field(init=False)

    def __post_init__(self) -> None:
        self.clusters = Clusters.lift(self.ray)
        self._where: dict[str, str | None] = {}  # job -> the cluster it is on
        self._reader: LogReader = self.reader or ByCluster(self.clusters, self._where)
        self._jobs: dict[str, str] = {}  # run id -> the Ray job of its current attempt
        # run id -> (offset of the step line left to the next read, when it was first left)
        self._awaiting: dict[str, tuple[int, float]] = {}

    def tick(self) -> None:
        held = self._claim()
        # A run on a cluster that is down is not read (its lease is kept): the health loop
        # ends it, or it is read on once its cluster is back; an attempt that had ended is
        # decided on the log kept once ``decide_within`` has passed.
        down = self.clusters.down()
        primary = self.clusters.primary.name
        on_down = [h for h in held if (h.cluster or primary) in down]
        held = [h for h in held if (h.cluster or primary) not in down]
        overdue = [
            self._cut_short(h, f"its cluster {h.cluster or primary} is down")
            for h in on_down
            if self._overdue(h)
        ]
        self._where.clear()
        self._where.update({r.job: r.cluster for r in held})
        self._jobs = {r.run_id: r.job for r in held}
        self._awaiting = {r: at for r, at in self._awaiting.items() if r in self._jobs}
        self._reader.retain(set(self._jobs.values()))
        now = time.time()
        self.last_read = {r.run_id: self.last_read.get(r.run_id, now) for r in held}
        failed: list[Exception] = []
        reads: list[_Read] = overdue
        for run in held:
            try:
                read = self._read(run)
            except (RayUnavailable, RayRejected, UnknownCluster) as exc:
                # One run's log that Ray fails to give holds up no other run's.
                log.warning("follower: reading the log of run %s failed: %s", run.run_id, exc)
                failed.append(exc)
                if self._overdue(run):
                    reads.append(self._cut_short(run, f"Ray fails to give its log ({exc})"))
                continue
            if read is not None and not read.final and self._overdue(run):
                why = "Ray has not given its log to the end"
                read = replace(read, final=True, cut_short=why)
            elif read is None and self._overdue(run):
                read = self._cut_short(run, "Ray no longer gives its log")
            if read is not None:
                reads.append(read)
        # A transaction per batch of runs, not per run: one commit, and the rows locked at once.
        for n in range(0, len(reads), self.batch):
            self._store(reads[n : n + self.batch])
            time.sleep(0)  # a writer waiting for its turn (a request, another loop) takes it now
        if failed and len(failed) == len(held):
            raise failed[0]

    def _claim(self) -> list[Held]:
        now = utcnow()
        with self.db.transaction() as session:
            # Every run that reached Ray gets a follower, even one that ended between two ticks.
            untracked = session.scalars(
                select(Run.id).where(
                    Run.submitted_at.is_not(None), ~exists().where(RunLog.run_id == Run.id)
                )
            ).all()
            if untracked:
                # Another replica may add the same rows at the same time: the first one wins.
                session.execute(
                    dialect_insert(session)(RunLog).on_conflict_do_nothing(),
                    [{"run_id": run_id, "log_offset": 0} for run_id in untracked],
                )
            # Runs this replica holds or whose holder's lease lapsed are all taken at once (a
            # replica that died hands its runs over within the lease); runs no replica holds
            # (new, or released) at most ``claim_new`` a tick, so replicas started together
            # share them.
            held_or_lapsed = and_(
                RunLog.lease_owner.is_not(None),
                or_(
                    RunLog.lease_owner == self.owner,
                    RunLog.lease_expires_at.is_(None),
                    RunLog.lease_expires_at < now,
                ),
            )
            query = (
                select(
                    RunLog.run_id,
                    RunLog.log_offset,
                    Run.status,
                    Run.ended_at,
                    Run.ray_ended_at,
                    Run.attempt,
                    RunLog.log_base,
                    Run.cluster,
                )
                .join(Run, Run.id == RunLog.run_id)
                # A retried run waiting for its next attempt has no job to read yet.
                .where(Run.submitted_at.is_not(None))
                .order_by(RunLog.run_id)
                .with_for_update(of=RunLog, skip_locked=True)
            )
            unfinished = RunLog.finished_at.is_(None)
            rows = [
                *session.execute(query.where(unfinished, held_or_lapsed)),
                *session.execute(
                    query.where(unfinished, RunLog.lease_owner.is_(None)).limit(self.claim_new)
                ),
            ]
            held = [
                Held(r, RunStatus(status), off, ended, ray_ended, n, base, cluster)
                for r, off, status, ended, ray_ended, n, base, cluster in rows
            ]
            # The leases taken or renewed in one statement per batch, not one per run.
            expires = now + timedelta(seconds=self.lease_s)
            for n in range(0, len(held), 1000):
                session.execute(
                    update(RunLog)
                    .where(RunLog.run_id.in_([h.run_id for h in held[n : n + 1000]]))
                    .values(lease_owner=self.owner, lease_expires_at=expires)
                )
        return held

    def release(self) -> None:
        """Give up this replica's leases (on shutdown) so another can take over at once."""
        self._reader.retain(set())
        with self.db.transaction() as session:
            for runlog in session.scalars(select(RunLog).where(RunLog.lease_owner == self.owner)):
                runlog.lease_owner = None
                runlog.lease_expires_at = None

    def _read(self, held: Held) -> _Read | None:
        """One read of one run's log; the final one when the run has ended (``held.status``
        was read before the log) and the reader has all of it. None: nothing to store."""
        ended_at = (held.ended_at or _LONG_AGO) if held.status in ENDED else held.ray_ended_at
        settled = ended_at is not None and utcnow() - ended_at >= FINAL_READ_AFTER
        text, complete = self._reader.read(
            held.job, held.offset - held.base, ended_at if settled else None
        )
        final = settled and complete
        word = self._deaths(held) if final and held.status in _FAILED else deaths.Word()
        if word.undecided and ended_at is not None and utcnow() - ended_at < deaths.VERDICT_WAIT:
            final = False  # Ray's health checks may yet find the unreachable actor's node dead
        if text is None and not final:
            return None  # Ray does not know the job (yet, or any more): the reconciler decides.
        new, every = split_lines(text or "", held.offset, final)
        # A sample's text is the job's data, never a metric line or a launcher's report.
        lines = [(end, line) for end, line in every if not samples.is_frame(line)]
        if ended_at is None and (cut := self._await_rest(held.run_id, lines)) is not None:
            new = new[: cut - held.offset]
            every = [(end, line) for end, line in every if end <= cut]
            lines = [(end, line) for end, line in lines if end <= cut]
        parsed = parse_lines(lines)
        reports = [r for _, line in lines if (r := parse_preflight(line)) is not None]
        ray_state = word.lines
        resumed = [s for _, line in lines if (s := resume.parse(line)) is not None]
        saves = [(end, s) for end, line in lines if (s := parse_checkpoint(line)) is not None]
        weights = [w for _, line in lines if (w := parse_weights(line)) is not None]
        marks = startup.marks_in(line for _, line in lines)
        if reports:
            marks.append(startup.PREFLIGHT)
        if any(TRAINER_STEP_KEY in m.values for _, m in parsed):
            marks.append(startup.FIRST_STEP)
        last = resumed[-1] if resumed else None
        framed = [line for _, line in every if samples.is_frame(line)]
        return _Read(
            held,
            new,
            parsed,
            reports,
            final,
            ray_state,
            last,
            saves,
            marks=marks,
            samples=samples.parse(framed) if framed else samples.Parsed([], {}),
            parts=log_parts(every) if framed else [(held.offset, new)],
            weights=weights,
        )

    def _await_rest(self, run_id: str, lines: list[tuple[int, str]]) -> int | None:
        """Where a live run's read is cut, the rest left to the next read: at a step line whose
        rest may be still to come, for ``await_rest_s`` at most; None: all of it is taken. Ray's
        log monitor can forward a long line in two parts that reach the job log in two reads;
        taken at once, the line would be lost."""
        if (i := awaiting_rest(lines)) is None:
            self._awaiting.pop(run_id, None)
            return None
        start, now = lines[i][0] - len(lines[i][1]), time.monotonic()
        at, since = self._awaiting.get(run_id, (start, now))
        self._awaiting[run_id] = (start, since if at == start else now)
        return None if at == start and now - since >= self.await_rest_s else start

    def _overdue(self, held: Held) -> bool:
        """Whether ``held``'s attempt ended longer than ``decide_within`` ago."""
        ended = held.ended_at if held.status in ENDED else None
        return ended is not None and utcnow() - ended >= self.decide_within

    def _cut_short(self, held: Held, why: str) -> _Read:
        """The final read of an attempt whose log's end Ray has not given in time: nothing
        more than what is kept."""
        wait = f"{self.decide_within.total_seconds():g} s"
        return _Read(held, "", [], [], True, cut_short=f"{why} {wait} after the attempt ended")

    def _deaths(self, held: Held) -> deaths.Word:
        job = held.job
        try:
            handle = self.clusters.of(held.cluster)
            return deaths.read(handle.ray, job, on_host=handle.local is not None)
        except (
            RayUnavailable,
            RayRejected,
            UnknownCluster,
            KeyError,
            TypeError,
            ValueError,
        ) as exc:
            # The log alone classifies the failure: Ray's state is evidence, not a condition.
            log.warning("follower: reading what died under job %s failed: %r", job, exc)
            return deaths.Word()

    def _store(self, reads: list[_Read]) -> None:
        """Store what was read of these runs in one transaction, each run's part only while
        this replica still holds its lease at the offset it read from."""
        stored: list[_Read] = []
        ended = retried = saved = False
        with self.db.transaction() as session:
            # What this transaction writes of the runs (complete once it has committed).
            changes = self.db.open_changes()
            rows = session.execute(
                select(RunLog, Run)
                .join(Run, Run.id == RunLog.run_id)
                .where(RunLog.run_id.in_([r.held.run_id for r in reads]))
                .order_by(RunLog.run_id)
                .with_for_update()
            ).all()
            locked = {runlog.run_id: (runlog, run) for runlog, run in rows}
            hooks = thresholds.listening(session)
            now = utcnow()
            # Each run's row changes are flushed together at commit, not before every query.
            session.autoflush = False
            for read in reads:
                runlog, run = locked.get(read.held.run_id, (None, None))
                if (
                    runlog is None
                    or run is None
                    or runlog.lease_owner != self.owner
                    or runlog.log_offset != read.held.offset
                ):
                    continue  # another replica took over meanwhile
                logged_before = runlog.last_step
                if read.resumed is not None:  # known before its points: they are kept by it
                    run.resumed_from_step = read.resumed
                self._weight_syncs(session, run, read)  # before the health checks read them
                self._ingest(session, run, runlog, read, now, hooks)
                for end, step in read.saves:
                    # The newest step logged when the save was said: what a stop then loses.
                    logged = max(
                        [m.step for e, m in read.parsed if e <= end]
                        + ([logged_before] if logged_before is not None else []),
                        default=None,
                    )
                    if checkpoint_saved(session, run, step, logged, now) is not None:
                        saved = True
                if read.reports:
                    run.preflight = read.reports[-1]
                if read.marks and (marked := startup.record(run.startup, read.marks, now)):
                    run.startup = marked
                if read.final:
                    yield_settled(session, run, runlog.last_step)
                    runlog.finished_at = now
                    runlog.lease_owner = None
                    runlog.lease_expires_at = None
                    # The whole log is read (or what is kept of it, Ray having failed to give
                    # the rest in time): how (a success Ray reported) and why it ended, then
                    # whether a next attempt starts.
                    short = None
                    if read.cut_short is not None:
                        short = f"decided on the log kept so far: {read.cut_short}"
                        note(session, run, short[:1000])
                    ending.at_final_read(session, run, self.retry, read.ray_state, short)
                    ended = ended or read.held.status not in ENDED
                    retried = retry.after_settle(session, run, self.retry) or retried
                stored.append(read)
        for read in stored:
            run_id = read.held.run_id
            self._reader.consumed(read.held.job, read.held.offset - read.held.base + len(read.new))
            if read.final:
                self.last_read.pop(run_id, None)
                self._jobs.pop(run_id, None)
                self._reader.retain(set(self._jobs.values()))
            else:
                self.last_read[run_id] = time.time()
            # A live stream carries status events and metric lines: text that holds neither
            # (most of a log) wakes none of it.
            if read.parsed or read.final or changes.of_events(run_id):
                self.notify(run_id)
        if ended:
            self.on_end()
        if retried:
            self.on_retry()
        if saved:
            self.on_checkpoint()

    def _weight_syncs(self, session: Session, run: Run, read: _Read) -> None:
        synced = [int(m.values[STEP_KEY]) for _, m in read.parsed if STEP_KEY in m.values]
        expects = bool(synced) and weight_sync.expects_digests(run)
        if read.weights or expects or (read.final and run.weight_syncs):
            succeeded = read.final and read.held.status == RunStatus.SUCCEEDED
            weight_sync.record(session, run, read.weights, synced, final=succeeded)

    def _ingest(
        self,
        session: Session,
        run: Run,
        runlog: RunLog,
        read: _Read,
        now: datetime,
        hooks: Sequence[Webhook],
    ) -> None:
        new = read.new
        if new:
            end = runlog.log_offset + len(new)
            logcopy.append_parts(session, run.id, read.parts, end, self.keep_chars)
            runlog.log_offset = end
            run.last_output_at = now
        if read.samples.samples or read.samples.skipped:
            samples.ingest(session, runlog, read.samples, self.sample_bounds)
        parsed, dropped = store.storable(read.parsed)
        for reason in read.samples.skipped:
            dropped[f"rollout sample lines skipped ({reason})"] = (
                f"rollout sample lines skipped ({reason}): each is counted in the run's samples"
                " (skipped), the rest are kept"
            )
        if parsed and store.superseded(session, runlog):
            # A later attempt's first points: what earlier ones logged from here on is replaced.
            # Not what they logged up to the checkpoint it resumed from, which holds those steps:
            # verl says that step again as it starts (its weight sync, its rollouter's figures),
            # and the earlier attempt's figures of that step are kept (its training metrics, which
            # verl prints one step late, above all).
            first = min(m.step for _, m in parsed)
            kept = run.resumed_from_step or 0
            store.supersede(session, runlog, max(first, kept + 1) if kept else first)
        if parsed:
            stored, over = store.ingest(session, runlog, parsed, self.limits)
            self.points_ingested += stored
            dropped |= over
        for prefix, text in dropped.items():
            noted = exists().where(RunEvent.run_id == run.id, RunEvent.reason.startswith(prefix))
            if not session.scalar(select(noted)):
                note(session, run, text)  # once per run and kind: the log keeps the rest
        if parsed:
            # A step printed is progress (and a NaN loss printed is news) even past the limits.
            top = max(m.step for _, m in parsed)
            if runlog.last_step is None or top > runlog.last_step:
                runlog.last_step = top
                runlog.last_step_at = now
        lines = [m for _, m in parsed]
        # Thresholds in the points' own transaction: a crossing's delivery is as durable.
        thresholds.evaluate(session, run, lines, hooks)
        evaluate(session, run, runlog, lines, now, self.rules)
        resumed.check(session, run, new, lines)
        targets.check(session, run, lines, self.target_within_s)
