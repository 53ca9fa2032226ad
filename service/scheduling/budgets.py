"""Budgets: accelerator-hours a team may use per UTC month (``RLRUN_TEAM_BUDGETS``).

Past its budget a team's queued runs wait with the reason "budget" (what it used, of how many,
this month) and are not offered to admission at all, so they hold no reservation and block no
one; what runs goes on. A run an admin let through (``over_budget_by``) is admitted as any
other. Usage is read as ``GET /usage`` reads it: the month's totals plus running runs up to now.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sqlalchemy.orm import Session

from service import usage
from service.scheduling.backlog import QueuedRow
from service.settings import Settings


@dataclass(frozen=True)
class Budgets:
    teams: dict[str, float] = field(default_factory=dict)
    default: float | None = None

    @classmethod
    def of_settings(cls, settings: Settings) -> Budgets:
        return cls(dict(settings.team_budgets), settings.default_team_budget)

    def of(self, team: str) -> float | None:
        return self.teams.get(team, self.default)

    def held_back(
        self, session: Session, rows: Sequence[QueuedRow], now: datetime
    ) -> dict[str, str]:
        """The queued runs of teams past their budget this month (but those let through),
        each with its reason."""
        teams = {
            r.run.team for r in rows if not r.over_budget_by and self.of(r.run.team) is not None
        }
        if not teams:
            return {}
        month = now.date().replace(day=1)
        upto = (month + timedelta(days=32)).replace(day=1)
        used = {
            row["team"]: row["accelerator_seconds"] / 3600
            for row in usage.report(session, month, upto, ["team"], now=now)
            if row["team"] in teams
        }
        out = {}
        for r in rows:
            budget = self.of(r.run.team)
            hours = used.get(r.run.team, 0.0)
            if r.over_budget_by or budget is None or hours < budget:
                continue
            out[r.run.id] = (
                f"budget: team {r.run.team} used {hours:.0f} of {budget:g} "
                f"{r.run.shape.accelerator}-hours this month"
            )
        return out
