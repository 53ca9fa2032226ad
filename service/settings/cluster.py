"""Sections of the Ray clusters runs go to: the clusters, and the embedded local head."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import ClassVar

from pydantic import Field, SecretStr

from service.settings.base import Counts, Names, Section


class RaySettings(Section):
    """The Ray cluster runs go to."""

    heading: ClassVar[str] = "Ray"

    ray_address: str = "local"
    """"local": start an embedded Ray head; otherwise the dashboard address of a cluster."""
    ray_token: SecretStr | None = None
    """Bearer token for a token-auth head."""
    ray_gcs_address: str | None = None
    """The GCS address (``host:port``, Ray's default port 6379) of the cluster of
    RLRUN_RAY_ADDRESS: where the nodes Ray drains are read, so that runs on them save and move
    first; unset: drains go unseen (an embedded head's is known). With a clusters file, each
    cluster's `gcs_address`."""
    ray_timeout_s: float = 10.0
    """The longest one call to Ray's Jobs API may take."""
    inventory_ttl_s: float = 3.0
    """How long the cluster inventory read from Ray is reused by the API."""
    clusters_file: str | None = None
    """A YAML file declaring several Ray clusters (see the clusters page); unset: one cluster,
    ``default``, at RLRUN_RAY_ADDRESS."""
    cluster_down_after_s: float = Field(default=6.0, gt=0)
    """With a clusters file: a cluster is marked down once every probe of its head failed for
    this long (two at least), and its active runs end LOST or are retried elsewhere. Shorter
    than this, a Ray timeout or a blip downs nothing."""
    cluster_probe_interval_s: float = Field(default=1.0, gt=0)
    """With a clusters file: how often each cluster's head is probed (each probe waits at most
    twice this)."""
    cluster_teams: Names = []
    """The teams whose runs the cluster of RLRUN_RAY_ADDRESS takes (empty: every team); with a
    clusters file, each cluster's `teams`."""
    secrets_on_shared_cluster: bool = False
    """With authentication on, a run naming secrets is refused on a cluster that other teams'
    runs go to too (their jobs, as the same user with the same Ray token, could read them);
    true allows it on the cluster of RLRUN_RAY_ADDRESS, its plan and page then naming those
    teams. With a clusters file, each cluster's `secrets_on_shared`."""

    @property
    def uses_local_ray(self) -> bool:
        return self.ray_address == "local"


class LocalClusterSettings(Section):
    """The embedded Ray head ``RLRUN_RAY_ADDRESS=local`` starts, with virtual NPUs."""

    heading: ClassVar[str] = "Local Ray cluster"

    local_npus: Counts = Field(default=[16], min_length=1)
    """Virtual NPUs per local node, e.g. "16" or "8,8" for two nodes."""
    local_cpus_per_node: int = 64
    """Logical CPUs each local node offers: Ray's scheduling numbers, not cores (verl's own
    actors ask for 28 on the CPU presets)."""
    local_ray_dir: str | None = None
    """Ray keeps sockets here: the path must stay short (default: a fresh dir under /tmp)."""
    local_ray_port: int | None = None
    """The head's GCS port. Unset: free ports chosen at start. Given but in use: the service
    refuses to start."""
    local_dashboard_port: int | None = None
    """The head's dashboard (Jobs API) port; unset or in use as for ``local_ray_port``."""
    local_ray_state_dir: str | None = None
    """Where the local nodes' process groups are recorded, so that the next start clears nodes
    a killed service left running (default: rlrun-<uid> in the system temp dir)."""

    local_job_user: str | None = None
    """The Unix user the embedded nodes, and so every job, run as (the service must run as
    root to start them so). Unset: as root, the service makes and uses rlrun-job-<instance>
    (see instance); not root, the nodes run as the service's own user (see
    local_single_tenant)."""
    instance: str | None = Field(default=None, pattern=r"^[a-z0-9][a-z0-9-]{0,11}$")
    """This service's name on its host, in its job users' names (rlrun-job-<instance>, and
    rlrun-job-<instance>-<cluster> for the embedded clusters of a clusters file). Unset: 8
    hex digits of its database's identity, so two services on one host (two databases) never
    share a job user, and replicas of one service (one database) do."""
    local_single_tenant: bool = False
    """Accept, with authentication on, an embedded cluster whose jobs run as the service's own
    user (not root and no local_job_user): every job can then read the service's environment,
    database and secrets, and so act as the service. Unset, such a start is refused."""

    @property
    def local_ray_state_path(self) -> Path:
        default = Path(tempfile.gettempdir()) / f"rlrun-{os.getuid()}"
        return Path(self.local_ray_state_dir) if self.local_ray_state_dir else default
