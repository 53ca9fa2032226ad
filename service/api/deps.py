"""What routes depend on: the app's services.

A route opens its own transaction in its body, ``with services.db.read() as s:`` or
``with services.db.transaction() as s:`` (writes), so the transaction is opened and closed by
the one thread that runs the body. A dependency that held a transaction would hand it from one
worker thread to another: with every worker waiting for that transaction's lock, none is left
to finish it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Annotated

from fastapi import Depends, Request

from service.api.limits import StreamSlots, ValidationSlots
from service.api.oidc import OidcVerifier
from service.api.read_cache import ReadCache
from service.api.revocation import Revocations
from service.api.sign_in_audit import FailedSignIns, Folding
from service.api.token_cache import TokenCache
from service.cluster.ray_jobs import RayRejected, RayUnavailable
from service.cluster.registry import Clusters
from service.loops.base import Loop
from service.loops.follower import Follower
from service.metrics.broker import Broker
from service.recipes.registry import RecipeRegistry
from service.scheduling.inventory import Inventory
from service.settings import Settings
from service.store.change_feed import ChangeFeed
from service.store.db import Database
from service.team_secrets import SecretStore

log = logging.getLogger(__name__)
# The largest value an INTEGER column holds on every backend: the bound of numeric queries.
INT32_MAX = 2**31 - 1
# Metric steps are BIGINT: the bound of step queries.
INT64_MAX = 2**63 - 1


@dataclass(frozen=True)
class Services:
    """What one replica runs on; built once when the app starts (``app.build_services``)."""

    settings: Settings
    db: Database
    registry: RecipeRegistry
    broker: Broker
    # Every Ray cluster runs go to, each with its client, inventory and health.
    clusters: Clusters
    loops: Mapping[str, Loop]
    follower: Follower | None
    reads: ReadCache
    # API tokens that signed in, trusted for ``signin_cache_s`` (forgotten when revoked).
    signed_in: TokenCache
    # The secrets specs name: checked when a run is accepted, read when its job redeems its grant.
    secrets: SecretStore
    streams: StreamSlots = field(default_factory=StreamSlots)
    validations: ValidationSlots = field(default_factory=ValidationSlots)
    # Live streams of API tokens, ended when their token is revoked.
    revocations: Revocations = field(default_factory=Revocations)
    # Failed sign-ins, written to the audit trail at most once a minute per network, capped in all.
    sign_ins: FailedSignIns = field(default_factory=FailedSignIns)
    # Refused redemptions of issued grants, audited at most once a minute per grant.
    grant_refusals: Folding = field(default_factory=Folding)
    # Other replicas' writes, told on PostgreSQL (``store/change_feed.py``).
    feed: ChangeFeed | None = None
    # Bearer JWTs of the identity provider, when one is configured.
    oidc: OidcVerifier | None = None

    def wake(self, name: str) -> None:
        """Run a loop's next tick now; safe from any thread, cheap (no thread of its own)."""
        if name in self.loops:
            self.loops[name].wake()

    def cluster(self, name: str | None = None) -> Inventory | None:
        """The cached inventory of cluster ``name`` (None: the primary), or None while its Ray
        cannot be read or it is down.

        It may call Ray: never inside a transaction."""
        handle = self.clusters.get(name)
        if handle is None or not handle.health.up:
            return None
        try:
            return handle.inventory.get()
        except (RayUnavailable, RayRejected) as exc:
            # Not a warning per request: the loops already warn while Ray is away.
            log.debug("cluster %s inventory unavailable: %s", handle.name, exc)
            return None


async def get_services(request: Request) -> Services:
    # async: a plain function dependency would cost each request a worker thread hand-over.
    services: Services = request.app.state.services
    return services


ServicesDep = Annotated[Services, Depends(get_services)]
