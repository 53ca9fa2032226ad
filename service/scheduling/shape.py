"""What a run holds on the cluster: groups of accelerators and CPUs that sit together."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property, lru_cache
from typing import Any, Literal


@dataclass(frozen=True)
class Group:
    """Accelerators and CPUs that must sit together on one node (one placement group).

    ``size_field`` and ``count_field`` name the spec fields (dotted paths) that set this group's
    accelerators and how many groups of its role there are, so a shape that can never fit is
    refused naming them, with a suggestion of values that fit the cluster.
    """

    role: str
    accelerators: int
    cpus: float
    size_field: str | None = None
    count_field: str | None = None


@dataclass(frozen=True)
class ResourceShape:
    """Everything a run holds on the cluster while it is active."""

    accelerator: Literal["NPU", "GPU"] = "NPU"
    groups: tuple[Group, ...] = ()
    driver_cpus: float = 1.0

    @cached_property
    def accelerators(self) -> int:
        return sum(g.accelerators for g in self.groups)

    def as_dict(self) -> dict[str, Any]:
        return {
            "accelerator": self.accelerator,
            "accelerators": self.accelerators,
            "driver_cpus": self.driver_cpus,
            "groups": [g.__dict__ for g in self.groups],
        }

    @staticmethod
    def from_dict(data: dict[str, Any]) -> ResourceShape:
        """The shape ``as_dict`` gave, one object for equal shapes: a round over thousands of
        queued runs of a few presets then hashes a few shapes, not one per run."""
        groups = tuple(tuple(g.items()) for g in data["groups"])
        return _interned(data["accelerator"], groups, data["driver_cpus"])


@lru_cache(maxsize=4096)
def _interned(
    accelerator: Literal["NPU", "GPU"],
    groups: tuple[tuple[tuple[str, Any], ...], ...],
    driver_cpus: float,
) -> ResourceShape:
    return ResourceShape(accelerator, tuple(Group(**dict(g)) for g in groups), driver_cpus)
