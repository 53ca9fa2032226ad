"""Sections of how teams share the cluster beyond quotas: fair share with a memory, and
preemption for priority."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from service.settings.base import Section


class FairShareSettings(Section):
    """Within a priority class, teams take turns by their standing: the accelerators they held
    lately (their usage, decayed with a half-life) plus those they hold now, over their quota
    (or the cluster's accelerators)."""

    heading: ClassVar[str] = "Fair share"

    fair_share_half_life_s: float = Field(default=86400.0, ge=0)
    """The half-life of past usage in a team's standing: an accelerator-hour this long ago
    counts half as much as one now (0: no memory; teams take turns by what they hold now)."""
