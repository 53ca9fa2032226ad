"""Fair share with a memory: within a priority class, teams take turns by their standing.

A team's standing is the accelerators it held lately (its usage decayed with a half-life) plus
those it holds now, over its weight (its quota or, without one, the cluster's accelerators), as
Kueue's Admission Fair Sharing orders queues by their decayed usage. The lowest standing goes
first; a team that had the whole cluster all week waits behind one that had nothing, even when
neither holds anything now.

Recent usage is read as accelerator-seconds, each weighted by ``2 ** -(age / half-life)``
(``usage.recent``). Divided by the decay's mean life (half-life / ln 2), it is the accelerators
the team held on average lately: the same unit as what it holds now (a team that has held 8
accelerators for many half-lives stands at 8 recent + 8 now). Pure: the usage is handed in.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

LN2 = math.log(2)


def recent_accelerators(decayed_s: Mapping[str, float], half_life_s: float) -> dict[str, float]:
    """Per team, the accelerators held on average lately, from its decayed accelerator-seconds
    (none without a half-life: the memory is off)."""
    if half_life_s <= 0:
        return {}
    mean_life = half_life_s / LN2
    return {team: s / mean_life for team, s in decayed_s.items() if s > 0}


def decay_over(start: float, end: float, now: float, half_life_s: float) -> float:
    """The weight of one accelerator-second spent evenly over ``[start, end]`` (epoch seconds)
    as seen at ``now``: the mean of ``2 ** -((now - t) / half_life_s)`` over the interval."""
    if end <= start:
        return float(2.0 ** (-max(0.0, now - end) / half_life_s))
    mean_life = half_life_s / LN2
    late = float(2.0 ** (-max(0.0, now - end) / half_life_s))
    early = float(2.0 ** (-max(0.0, now - start) / half_life_s))
    return mean_life * (late - early) / (end - start)


@dataclass(frozen=True)
class Standing:
    """One team's place in the fair share: ``recent`` (accelerators held on average lately),
    ``holds`` (accelerators held now), measured against ``weight``."""

    team: str
    recent: float
    holds: int
    weight: float

    @property
    def value(self) -> float:
        return (self.recent + self.holds) / self.weight

    def says(self) -> str:
        return (
            f"team {self.team}'s fair share stands at {self.value:.2f} "
            f"(recently {self.recent:.1f} + holds {self.holds} of {self.weight:g} accelerators)"
        )

    def as_dict(self) -> dict[str, float | int]:
        return {
            "recent": round(self.recent, 3),
            "holds": self.holds,
            "weight": self.weight,
            "standing": round(self.value, 4),
        }


def standing_of(
    team: str,
    used: Mapping[str, int],
    recent: Mapping[str, float],
    weight: Callable[[str], float],
) -> Standing:
    return Standing(team, recent.get(team, 0.0), used.get(team, 0), max(1.0, weight(team)))
