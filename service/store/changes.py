"""What a write transaction changed of the runs: read from the statements it runs, so no writer
has to say it (``Database`` collects them and hands them over after the commit).

Watched are ``runs`` (by id) and ``run_events`` (by run id): what a run's answers show besides
its metrics. A statement on them whose rows cannot be told from it (an UPDATE not restricted to
some ids, an INSERT from a SELECT) counts as a change of every run. Updates of ``api_tokens`` (a
revocation) are watched too, by token id: a replica forgets the tokens it keeps signed in. A
pin or unpin of a baseline (``baselines``) changes what every compared answer of its team's
runs shows: it counts as a change of every run (it is rare).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.sql import operators
from sqlalchemy.sql.dml import Delete, Insert, Update
from sqlalchemy.sql.elements import (
    BinaryExpression,
    BindParameter,
    BooleanClauseList,
    ColumnClause,
    ColumnElement,
)

# Watched table -> the column naming the run of a row.
WATCHED = {"runs": "id", "run_events": "run_id"}
TOKENS = "api_tokens"
BASELINES = "baselines"


@dataclass
class RunChange:
    """One run's change in one transaction."""

    # Columns of ``runs`` an INSERT or UPDATE set.
    columns: set[str] = field(default_factory=set)
    inserted: bool = False
    deleted: bool = False
    events: bool = False  # rows of ``run_events`` written
    # The status and team set, when the statements say (an UPDATE of the status alone does
    # not name the team).
    status: str | None = None
    team: str | None = None

    def then(self, later: RunChange) -> None:
        """Take in the run's ``later`` change (of a later transaction): both together."""
        self.columns |= later.columns
        self.inserted |= later.inserted
        self.deleted |= later.deleted
        self.events |= later.events
        self.status = later.status if later.status is not None else self.status
        self.team = later.team if later.team is not None else self.team


@dataclass
class Changes:
    runs: dict[str, RunChange] = field(default_factory=dict)
    everything: bool = False
    # API tokens updated or deleted (revoked), by id; with ``everything``: any may have been.
    tokens: set[str] = field(default_factory=set)

    def __bool__(self) -> bool:
        return self.everything or bool(self.runs) or bool(self.tokens)

    def then(self, later: Changes) -> None:
        """Take in ``later`` (of transactions committed after these): what they changed
        together. Runs and tokens are not kept once everything has changed."""
        self.everything |= later.everything
        if self.everything:
            self.runs.clear()
            self.tokens.clear()
            return
        self.tokens |= later.tokens
        for run_id, change in later.runs.items():
            mine = self.runs.get(run_id)
            if mine is None:  # a change of its own, never the later transaction's object
                mine = self.runs[run_id] = RunChange()
            mine.then(change)

    def of_events(self, run_id: str) -> bool:
        """Whether the run may have got events (a statement of unknown rows: it may)."""
        change = self.runs.get(run_id)
        return self.everything or (change is not None and change.events)

    def record(self, statement: Any, rows: Sequence[dict[str, Any]]) -> None:
        """Take in one executed DML statement and its parameter sets."""
        table = getattr(statement, "table", None)
        name = getattr(table, "name", "")
        if name == TOKENS and isinstance(statement, Update | Delete):
            self._tokens(statement, rows)
            return
        if name == BASELINES:
            self.everything = True
            return
        key = WATCHED.get(name)
        if key is None or self.everything:
            return
        runs = key == "id"
        if isinstance(statement, Insert):
            if statement.select is not None:
                self.everything = True
                return
            for row in rows:
                run_id = row.get(key)
                if run_id is None:
                    self.everything = True
                    return
                change = self._of(run_id)
                if not runs:
                    change.events = True
                    continue
                change.inserted = True
                change.columns |= row.keys()
                change.status, change.team = row.get("status"), row.get("team")
            return
        if not isinstance(statement, Update | Delete):
            return
        column = statement.table.c[key]
        for row in rows:
            ids = _restricted_to(statement.whereclause, column, row)
            if ids is None:
                self.everything = True
                return
            for run_id in ids:
                change = self._of(run_id)
                if not runs:
                    change.events = True
                elif isinstance(statement, Delete):
                    change.deleted = True
                else:
                    # Parameters named as a column are the SET clause's (the WHERE clause's
                    # are named after their column and a number).
                    set_ = {k for k in row if k in statement.table.c}
                    change.columns |= set_
                    if "status" in set_:
                        change.status = row["status"]
                    if "team" in set_:
                        change.team = row["team"]

    def _tokens(self, statement: Update | Delete, rows: Sequence[dict[str, Any]]) -> None:
        for row in rows:
            ids = _restricted_to(statement.whereclause, statement.table.c["id"], row)
            if ids is None:
                self.everything = True
                return
            self.tokens.update(ids)

    def _of(self, run_id: str) -> RunChange:
        change = self.runs.get(run_id)
        if change is None:
            change = self.runs[run_id] = RunChange()
        return change


def _restricted_to(
    where: ColumnElement[Any] | None, column: Any, row: dict[str, Any]
) -> list[str] | None:
    """The ids a WHERE clause restricts ``column`` to (``= :x`` or ``IN (...)`` joined by AND to
    whatever else), or None if it does not."""
    if where is None:
        return None
    terms = [where]
    while terms:
        term = terms.pop()
        if isinstance(term, BooleanClauseList) and term.operator is operators.and_:
            terms += term.clauses
            continue
        if not (
            isinstance(term, BinaryExpression)
            and isinstance(term.left, ColumnClause)
            and term.left.name == column.name
            and getattr(term.left.table, "name", None) == column.table.name
            and isinstance(term.right, BindParameter)
        ):
            continue
        bound = term.right
        # A value given with the statement, or (the ORM's flush) with the parameters.
        value = bound.value if bound.value is not None else row.get(bound.key)
        if term.operator is operators.eq and isinstance(value, str):
            return [value]
        if term.operator is operators.in_op and isinstance(value, list | tuple):
            return [str(v) for v in value]
    return None
