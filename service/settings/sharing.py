"""Sections of how teams share the cluster beyond quotas: fair share with a memory, and
preemption for priority."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, field_validator

from service.scheduling.priority import PRIORITIES
from service.settings.base import Names, Section


class FairShareSettings(Section):
    """Within a priority class, teams take turns by their standing: the accelerators they held
    lately (their usage, decayed with a half-life) plus those they hold now, over their quota
    (or the cluster's accelerators)."""

    heading: ClassVar[str] = "Fair share"

    fair_share_half_life_s: float = Field(default=86400.0, ge=0)
    """The half-life of past usage in a team's standing: an accelerator-hour this long ago
    counts half as much as one now (0: no memory; teams take turns by what they hold now)."""


class PreemptionSettings(Section):
    """Preemption for priority: a queued run that cannot fit, and would if some runs of a lower
    priority were gone, asks them to stop at their next checkpoint; they go back to the queue
    as a new attempt of the same run and resume from that checkpoint."""

    heading: ClassVar[str] = "Preemption"

    preemption: Literal["on", "off"] = "off"
    """Whether a higher-priority run may preempt lower-priority ones."""
    preemption_grace_s: float = Field(default=300.0, gt=0, le=86400)
    """How long a victim has to reach its next complete checkpoint; it is stopped at the end
    of it otherwise (the steps since its last save are lost)."""
    preemption_min_admitted_s: float = Field(default=600.0, ge=0)
    """A run admitted less than this long ago is not preempted."""
    preemption_max_times: int = Field(default=3, ge=1)
    """A run preempted this many times is left alone for preemption_rest_s."""
    preemption_rest_s: float = Field(default=3600.0, ge=0)
    """How long a run preempted preemption_max_times is left alone (counted from its last
    preemption)."""
    preemption_without_checkpoints: bool = True
    """Whether a run whose launch saves no checkpoints may be preempted (it loses every step
    since its start, and its plan says so); off: such runs are never preempted. The operator's
    choice, not the run's: with it on, ``save_every: 0`` exempts nothing."""
    preemptible_priorities: Names = ["low", "normal"]
    """The priorities whose runs may be preempted (by any run of a higher priority)."""
    preemption_spared_teams: Names = []
    """Teams whose runs are never preempted, whatever their priority and checkpoints."""

    @field_validator("preemptible_priorities")
    @classmethod
    def _known(cls, names: list[str]) -> list[str]:
        unknown = [n for n in names if n not in PRIORITIES]
        if unknown:
            raise ValueError(
                f"RLRUN_PREEMPTIBLE_PRIORITIES names {', '.join(map(repr, unknown))}: "
                f"the priorities are {', '.join(PRIORITIES)}"
            )
        return names
