"""The clusters a service sends runs to, as an operator declares them (``RLRUN_CLUSTERS_FILE``,
YAML), or the one ``default`` cluster of ``RLRUN_RAY_ADDRESS`` when no file is given.

A cluster's Ray token is never in the file: ``token: {secret: NAME}`` names a secret of the
service's own namespace, which no run's spec can name (``service.team_secrets``: the file
``<RLRUN_SECRETS_DIR>/service/NAME`` or the env var ``RLRUN_SERVICE_SECRET_<NAME>``).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from service.recipes.verl.paths import under_roots
from service.settings import Settings

DEFAULT = "default"
CLUSTER_NAME = r"^[a-z0-9][a-z0-9-]{0,62}$"
Accelerator = Literal["NPU", "GPU"]


class ClustersFileError(ValueError):
    """The clusters file cannot be used; the message names the file and the field path."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class LocalShape(_Strict):
    """An embedded Ray head the service starts and stops (tests, laptops)."""

    npus: list[int] = Field(min_length=1)
    cpus_per_node: int = Field(16, ge=1)
    port: int | None = Field(None, ge=1, le=65535)
    dashboard_port: int | None = Field(None, ge=1, le=65535)
    # The Unix user its nodes run as (as root); unset: rlrun-job-<instance>-<cluster name>,
    # made once, so that no two embedded clusters (of one service or two) share one.
    user: str | None = Field(None, pattern=r"^[a-z_][a-z0-9_-]{0,31}$")


class TokenRef(_Strict):
    secret: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


class ClusterSpec(_Strict):
    name: str = Field(pattern=CLUSTER_NAME)
    address: str | None = None
    local: LocalShape | None = None
    token: TokenRef | None = None
    # Its GCS (``host:port``): where the nodes Ray drains are read (``loops.drains``).
    gcs_address: str | None = Field(None, pattern=r"^[A-Za-z0-9.\[\]:-]+:[0-9]{1,5}$")
    # None: not declared (the default cluster of RLRUN_RAY_ADDRESS): any selector's kind fits.
    accelerator: Accelerator | None = None
    verl_versions: list[str] = Field(default_factory=list)  # empty: not declared, any
    image: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    teams: list[str] | None = None  # None: every team
    # Runs naming secrets may come here although other teams' runs do too (whose jobs, as the
    # same Unix user with the same Ray token, could read them): the operator's allowance.
    secrets_on_shared: bool = False
    # Accelerators each team may hold on this cluster ("*": every team not named), besides the
    # service-wide quotas.
    quotas: dict[str, int] = Field(default_factory=dict)
    data_roots: list[str] = Field(default_factory=list)
    checkpoint_root: str | None = None

    @model_validator(mode="after")
    def _one_way_in(self) -> ClusterSpec:
        if (self.address is None) == (self.local is None):
            raise ValueError("give exactly one of `address` (a Ray dashboard URL) and `local`")
        return self

    @field_validator("address")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("http://", "https://")):
            raise ValueError("expected the Ray dashboard's URL, e.g. http://head:8265")
        return value

    @field_validator("data_roots")
    @classmethod
    def _roots(cls, value: list[str]) -> list[str]:
        for root in value:
            if not (root.startswith("/") or "://" in root) or ".." in root.split("/"):
                raise ValueError(f"{root!r}: expected an absolute path or a URI prefix, no '..'")
        return [r.rstrip("/") or "/" for r in value]

    @field_validator("checkpoint_root")
    @classmethod
    def _absolute(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith("/"):
            raise ValueError("expected an absolute path on the cluster's nodes")
        return value

    def admits_team(self, team: str) -> bool:
        return self.teams is None or team in self.teams

    def other_teams(self, team: str) -> str | None:
        """The other teams whose runs this cluster takes, in words; None if none."""
        if self.teams is None:
            return "every team"
        others = sorted(set(self.teams) - {team})
        return ", ".join(others) if others else None

    def holds(self, paths: Sequence[str]) -> bool:
        """Whether its nodes hold every one of ``paths`` (no data roots declared: any)."""
        return not self.data_roots or all(under_roots(p, self.data_roots) for p in paths)

    def runs_verl(self, version: str | None) -> bool:
        return version is None or not self.verl_versions or version in self.verl_versions


class ClustersFile(_Strict):
    clusters: list[ClusterSpec] = Field(min_length=1)

    @field_validator("clusters")
    @classmethod
    def _unique(cls, value: list[ClusterSpec]) -> list[ClusterSpec]:
        seen: set[str] = set()
        for spec in value:
            if spec.name in seen:
                raise ValueError(f"cluster name {spec.name!r} is declared twice")
            seen.add(spec.name)
        return value


def load(path: str | Path) -> list[ClusterSpec]:
    """The clusters of the file at ``path``; ``ClustersFileError`` naming the field path."""
    try:
        data = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ClustersFileError(f"clusters file {path}: {exc}") from exc
    try:
        return ClustersFile.model_validate(data).clusters
    except ValidationError as exc:
        lines = [
            f"{'.'.join(str(p) for p in e['loc']) or '(top)'}: {e['msg']}" for e in exc.errors()
        ]
        raise ClustersFileError(f"clusters file {path}: " + "; ".join(lines)) from exc


def declared(settings: Settings) -> list[ClusterSpec]:
    """The service's clusters: the file's, or ``default`` from ``RLRUN_RAY_ADDRESS``."""
    if settings.clusters_file:
        return load(settings.clusters_file)
    shared: dict[str, Any] = {
        "teams": list(settings.cluster_teams) or None,
        "secrets_on_shared": settings.secrets_on_shared_cluster,
    }
    if settings.uses_local_ray:
        local = LocalShape(
            npus=list(settings.local_npus),
            cpus_per_node=settings.local_cpus_per_node,
            port=settings.local_ray_port,
            dashboard_port=settings.local_dashboard_port,
        )
        return [ClusterSpec(name=DEFAULT, local=local, **shared)]
    return [
        ClusterSpec(
            name=DEFAULT,
            address=settings.ray_address,
            gcs_address=settings.ray_gcs_address,
            **shared,
        )
    ]
