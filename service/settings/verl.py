"""The section of the verl fully async recipe."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from pydantic import Field, field_validator

from service.settings.base import Names, Section


class VerlSettings(Section):
    """The verl fully async recipe: paths on the cluster's nodes, loggers, the preflight."""

    heading: ClassVar[str] = "verl recipe"

    verl_data_dir: str = "/data"
    """Absolute dir on the cluster nodes for data."""
    verl_model_dir: str = "/models"
    """Absolute dir on the cluster nodes for models."""
    verl_checkpoint_root: str = "/checkpoints"
    """Absolute dir on the cluster nodes for checkpoints (each run gets <root>/<run id>)."""
    data_roots: Names = []
    """Where else a spec's paths may point, read-only in intent (absolute dirs on the nodes, or
    URI prefixes such as "hdfs://namenode/datasets"), besides the data and model dirs.
    Checkpoints: only the run's own directory, whatever is listed here."""
    verl_loggers_configured: Names = []
    """The logger backends needing credentials (e.g. "wandb,mlflow") that the cluster has set
    up; others are left out of presets."""
    verl_cache_dir: str = Field(
        default_factory=lambda: str(Path.home() / ".cache" / "rlrun" / "verl")
    )
    """Where `rlrun verl add X` unpacks other verl versions specs may name (`verl_version`);
    default: ~/.cache/rlrun/verl."""
    verl_index_json_url: str = "https://pypi.org/pypi"
    """The package index's JSON API `rlrun verl add` takes a wheel's SHA-256 from (PyPI's
    <url>/<project>/json); pip downloads from its own configured index."""
    preflight_packages: Names = ["auto"]
    """The packages the nodes must carry, checked by the launcher on every node before verl
    starts: "auto" (verl at the validated version, transformers in verl's own range, the
    accelerator's torch/vllm stack installed) or requirements such as
    "torch-npu==2.10.0.post4,vllm-ascend==0.23.0" (a JSON list for one with a comma), verl's
    pin always added. Unless empty, the nodes' installed stack is also checked against the pairs
    known to break (jobs/verl_launch/pairs.py), and exact pins here count at submit."""
    preflight_check_devices: bool = True
    """The preflight checks Ray's accelerators are real device files (off for virtual NPUs)."""
    preflight_timeout_s: float = 60.0
    """How long the nodes' preflight may take."""

    @field_validator("verl_data_dir", "verl_model_dir", "verl_checkpoint_root")
    @classmethod
    def _absolute(cls, value: str) -> str:
        if not value.startswith("/"):
            raise ValueError("expected an absolute path on the cluster nodes")
        return value.rstrip("/") or "/"

    @field_validator("data_roots")
    @classmethod
    def _roots(cls, value: list[str]) -> list[str]:
        out = []
        for root in value:
            root = root.strip()
            if not (root.startswith("/") or "://" in root) or ".." in root.split("/"):
                raise ValueError(f"{root!r}: expected an absolute path or a URI prefix, no '..'")
            out.append(root.rstrip("/") or "/")
        return out

    @property
    def verl_data_roots(self) -> tuple[str, ...]:
        """Every root a spec's paths may point under (the run's own dir apart)."""
        return tuple(dict.fromkeys([self.verl_data_dir, self.verl_model_dir, *self.data_roots]))
