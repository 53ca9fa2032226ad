"""What a run holds on the cluster: groups of accelerators and CPUs that sit together."""

from __future__ import annotations

from dataclasses import dataclass
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

    @property
    def accelerators(self) -> int:
        return sum(g.accelerators for g in self.groups)

    def as_dict(self) -> dict[str, Any]:
        return {
            "accelerator": self.accelerator,
            "accelerators": self.accelerators,
            "driver_cpus": self.driver_cpus,
            "groups": [g.__dict__ for g in self.groups],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ResourceShape:
        return cls(
            accelerator=data["accelerator"],
            groups=tuple(Group(**g) for g in data["groups"]),
            driver_cpus=data["driver_cpus"],
        )
