"""Budgets: accelerator-hours a team may use per UTC month (``RLRUN_TEAM_BUDGETS``).

Past its budget a team's queued runs wait with the reason "budget" (what it used, of how many,
this month; the run shows the figures and by how much it is past, ``runs.budget_wait``) and are
not offered to admission at all, so they hold no reservation and block no one; what runs goes
on. A run an admin let through (``over_budget_by``) is admitted as any other. Usage is read as
``GET /usage`` reads it: the month's totals plus running runs up to now.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy.orm import Session

from service import usage
from service.scheduling.backlog import QueuedRow
from service.settings import Settings


@dataclass(frozen=True)
class OverBudget:
    """A team past its budget this month: what it used, of how many accelerator-hours."""

    team: str
    month: str  # YYYY-MM, a UTC month
    used_hours: float
    budget_hours: float
    accelerator: str

    @property
    def reason(self) -> str:
        return (
            f"budget: team {self.team} used {self.used_hours:.0f} of {self.budget_hours:g} "
            f"{self.accelerator}-hours this month"
        )

    def doc(self) -> dict[str, Any]:
        """What the run shows (``runs.budget_wait``), to a tenth of an hour: it changes, and is
        written again, only as often as that."""
        return {
            "month": self.month,
            "used_hours": round(self.used_hours, 1),
            "budget_hours": self.budget_hours,
            "over_by_hours": round(self.used_hours - self.budget_hours, 1),
            "accelerator": self.accelerator,
        }


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
    ) -> dict[str, OverBudget]:
        """The queued runs of teams past their budget this month (but those let through),
        each with what its team used of how much."""
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
            out[r.run.id] = OverBudget(
                r.run.team, month.strftime("%Y-%m"), hours, budget, r.run.shape.accelerator
            )
        return out
