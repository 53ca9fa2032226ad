"""The clusters one replica talks to: per cluster its declared spec, its Ray client, its
inventory cache, its embedded head (if the service starts one) and its health.

Loops and operations ask for the cluster of a run (``clusters.of(run.cluster)``), never for a
global client. Which clusters a run may go to (its team, the cluster it names, its selector and
verl version) is ``candidates``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from service.clock import utcnow
from service.cluster.inventory_cache import InventoryCache
from service.cluster.local_ray import LocalRayCluster
from service.cluster.ray_jobs import RayJobs
from service.cluster.spec import DEFAULT, ClustersFileError, ClusterSpec
from service.errors import InvalidSpec, field_error
from service.scheduling.admission import Quotas
from service.settings import Settings
from service.team_secrets import SecretStore

log = logging.getLogger(__name__)


class UnknownCluster(LookupError):
    """A run records a cluster this replica does not know (the clusters file changed)."""


@dataclass
class Health:
    """Up or down, and since when. Down only once every probe failed for a whole window: a
    blip (one Ray timeout) downs nothing."""

    up: bool = True
    since: datetime = field(default_factory=utcnow)
    failing_since: datetime | None = None  # the first failure of the current run of them
    failures: int = 0
    error: str | None = None

    def observe(
        self, ok: bool, window_s: float, now: datetime, error: str | None = None
    ) -> Literal["down", "up"] | None:
        """Record one probe; the change it makes, if any."""
        if ok:
            self.failing_since, self.failures, self.error = None, 0, None
            if self.up:
                return None
            self.up, self.since = True, now
            return "up"
        self.failures += 1
        self.error = error
        if self.failing_since is None:
            self.failing_since = now
        if (
            self.up
            and self.failures >= 2
            and (now - self.failing_since).total_seconds() >= window_s
        ):
            self.up, self.since = False, now
            return "down"
        return None

    @property
    def down_reason(self) -> str | None:
        return None if self.up else f"cluster down since {self.since:%H:%M:%S}"


@dataclass
class ClusterHandle:
    spec: ClusterSpec
    ray: RayJobs
    inventory: InventoryCache
    local: LocalRayCluster | None = None
    health: Health = field(default_factory=Health)

    @property
    def name(self) -> str:
        return self.spec.name


class Clusters:
    """Every cluster of the replica, in declared order (the first is the primary: runs that
    record no cluster, and the settings that have no per-cluster form, belong to it)."""

    def __init__(self, handles: Sequence[ClusterHandle], guard_secrets: bool = False) -> None:
        if not handles:
            raise ValueError("at least one cluster")
        self._handles = {h.name: h for h in handles}
        self.primary = handles[0]
        # With authentication on: a run naming secrets goes only where no other team's runs
        # go, unless the operator allowed secrets on that shared cluster.
        self.guard_secrets = guard_secrets

    @classmethod
    def single(cls, ray: RayJobs, inventory: InventoryCache | None = None) -> Clusters:
        """One cluster, ``default``, on ``ray``."""
        spec = ClusterSpec(name=DEFAULT, address="http://ray")
        return cls([ClusterHandle(spec, ray, inventory or InventoryCache(ray, 0.0))])

    @classmethod
    def lift(cls, ray: RayJobs | Clusters, inventory: InventoryCache | None = None) -> Clusters:
        """``ray`` as clusters: a lone client (with its inventory) is the one ``default``."""
        return ray if isinstance(ray, Clusters) else cls.single(ray, inventory)

    def __iter__(self) -> Iterator[ClusterHandle]:
        return iter(self._handles.values())

    def __len__(self) -> int:
        return len(self._handles)

    @property
    def names(self) -> list[str]:
        return list(self._handles)

    def of(self, name: str | None) -> ClusterHandle:
        """The cluster a run records (None: the primary); ``UnknownCluster`` if not declared."""
        if name is None:
            return self.primary
        try:
            return self._handles[name]
        except KeyError:
            raise UnknownCluster(f"cluster {name!r} is not declared") from None

    def get(self, name: str | None) -> ClusterHandle | None:
        return self.primary if name is None else self._handles.get(name)

    def down(self) -> dict[str, str]:
        """Name -> why, of the clusters that are down now."""
        return {h.name: h.health.down_reason or "" for h in self if not h.health.up}

    def candidates(
        self,
        team: str,
        cluster: str | None = None,
        accelerator: str | None = None,
        labels: Mapping[str, str] | None = None,
        verl_version: str | None = None,
        reads: Sequence[str] = (),
        secrets: bool = False,
    ) -> list[str]:
        """The clusters a run of ``team`` (naming ``secrets`` or not) may go to, in declared
        order; 422 at the field that leaves none."""
        labels = labels or {}
        if cluster is not None:
            spec = self._handles[cluster].spec if cluster in self._handles else None
            if spec is None:
                _refuse(["cluster"], f"no cluster {cluster!r} (known: {', '.join(self.names)})")
            elif not spec.admits_team(team):
                _refuse(["cluster"], f"team {team!r} may not use cluster {cluster!r}")
            elif not spec.runs_verl(verl_version):
                _refuse(
                    ["cluster"],
                    f"cluster {cluster!r} does not run verl {verl_version} "
                    f"(it runs {', '.join(spec.verl_versions)})",
                )
            specs = [spec] if spec is not None else []
        else:
            specs = [h.spec for h in self if h.spec.admits_team(team)]
            if not specs:
                _refuse(["team"], f"team {team!r} may use no cluster")
        if accelerator is not None:
            specs = [s for s in specs if s.accelerator in (None, accelerator)]
            if not specs:
                _refuse(["placement", "accelerator"], f"no cluster of {accelerator} for {team!r}")
        for key, value in labels.items():
            specs = [s for s in specs if s.labels.get(key) == value]
            if not specs:
                _refuse(["placement", "labels", key], f"no cluster has label {key}={value}")
        specs = [s for s in specs if s.runs_verl(verl_version)]
        if not specs:
            _refuse(["verl_version"], f"no cluster the run may use runs verl {verl_version}")
        held = [s for s in specs if s.holds(reads)]
        if not held:
            missing = next(p for p in reads if not all(s.holds([p]) for s in specs))
            loc: list[str | int] = ["cluster"] if cluster is not None else ["data"]
            _refuse(
                loc, f"no cluster the run may use has all its paths under its data roots: {missing}"
            )
        if secrets and self.guard_secrets:
            kept = [s for s in held if s.secrets_on_shared or s.other_teams(team) is None]
            if not kept:
                shared = "; ".join(f"cluster {s.name!r} takes {s.other_teams(team)}" for s in held)
                _refuse(
                    ["secrets"],
                    f"the run names secrets, and other teams' jobs could read them: {shared} "
                    "(another team's job runs as the same user, with the same Ray token); use a "
                    "cluster of the team's own (the clusters file's `teams`, or "
                    "RLRUN_CLUSTER_TEAMS), or an operator may allow secrets there "
                    "(RLRUN_SECRETS_ON_SHARED_CLUSTER; in the clusters file, `secrets_on_shared`)",
                )
            held = kept
        return [s.name for s in held]

    def secret_readers(self, team: str, names: Sequence[str]) -> list[str]:
        """For a run of ``team`` naming secrets, allowed on shared clusters among ``names``:
        which other teams' jobs could read its secrets, one sentence per such cluster."""
        if not self.guard_secrets:
            return []
        return [
            f"its secrets are readable by the jobs of {others} on cluster {name!r} "
            "(secrets allowed there by the operator although the cluster is shared)"
            for name in names
            if (others := self._handles[name].spec.other_teams(team)) is not None
        ]

    def shared_among(self, team: str, names: Sequence[str]) -> list[str]:
        """Those of ``names`` that other teams' runs go to too (authentication on): where their
        jobs run as the same Unix user as a run of ``team``'s and can write its log."""
        if not self.guard_secrets:
            return []
        return [n for n in names if self._handles[n].spec.other_teams(team) is not None]

    def shared_record(self, team: str, names: Sequence[str]) -> list[str]:
        """For a run of ``team`` (authentication on) that may go to ``names``: on each of them
        that other teams' runs go to, what those teams' jobs can do to it, one sentence each.
        No service in front of Ray can check a log line or a file against the job that wrote
        it when both jobs run as one Unix user."""
        if not self.guard_secrets:
            return []
        return [
            f"on cluster {name!r} the jobs of {others} run as the same Unix user as this run's: "
            "they can write its log (what the service records of it follows that log: its "
            "progress, checkpoints, metrics and samples, a target reached, its stop record, the "
            "class of a failure that Ray and the kernel do not record, and so whether it is "
            "retried), read and write its run "
            "directories and signal its processes; a cluster of the team's own (the clusters "
            "file's `teams`, or RLRUN_CLUSTER_TEAMS) closes it"
            for name in names
            if (others := self._handles[name].spec.other_teams(team)) is not None
        ]

    def for_queued(
        self, team: str, launch: Mapping[str, Any], previous: str | None = None
    ) -> list[str]:
        """The clusters a queued run may go to now, from what its spec asked (``where`` and
        ``reads``, kept with its launch; none left if the clusters changed since it was
        accepted); a run that ran on a cluster stays there while that one is up."""
        where = launch.get("where") or {}
        try:
            names = self.candidates(
                team,
                where.get("cluster"),
                where.get("accelerator"),
                where.get("labels"),
                where.get("verl_version"),
                launch.get("reads") or (),
                bool(launch.get("secrets")),
            )
        except InvalidSpec:
            return []
        here = self.get(previous)
        if previous in names and here is not None and here.health.up:
            return [previous]
        return names

    def close(self) -> None:
        for handle in self:
            handle.ray.close()


def _refuse(loc: list[str | int], msg: str) -> None:
    raise InvalidSpec(msg, [field_error(loc, msg, "cluster")])


def build(
    settings: Settings,
    specs: Sequence[ClusterSpec],
    secrets: SecretStore,
    local: Mapping[str, LocalRayCluster],
) -> Clusters:
    """The clusters of ``specs``: each a Ray client (a started embedded head's, from ``local``)
    with its token from the secret store, and an inventory cache."""
    handles = []
    for i, spec in enumerate(specs):
        head = local.get(spec.name)
        if head is not None:
            address, token = head.address, head.token
        else:
            assert spec.address is not None
            address, token = spec.address, None
            if spec.token is not None:
                token = secrets.service_secret(spec.token.secret)
                if token is None:
                    raise ClustersFileError(
                        f"clusters file {settings.clusters_file}: clusters.{i}.token.secret: "
                        f"no secret {spec.token.secret!r} in the service's own namespace"
                    )
            elif not settings.clusters_file and settings.ray_token is not None:
                token = settings.ray_token.get_secret_value()
        ray = RayJobs(address, token, settings.ray_timeout_s)
        handles.append(
            ClusterHandle(spec, ray, InventoryCache(ray, settings.inventory_ttl_s), head)
        )
    return Clusters(handles, guard_secrets=settings.auth_enabled)


def cluster_quotas(spec: ClusterSpec) -> Quotas:
    """A cluster's own quotas as declared (``"*"``: every team not named)."""
    teams = {t: n for t, n in spec.quotas.items() if t != "*"}
    return Quotas(teams, spec.quotas.get("*"))
