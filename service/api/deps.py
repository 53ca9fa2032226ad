"""What routes depend on: the app's services, and one DB transaction per request."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request
from sqlalchemy.orm import Session

from service.cluster.ray_jobs import RayJobs, RayRejected, RayUnavailable
from service.loops.base import Loop
from service.loops.follower import Follower
from service.metrics.broker import Broker
from service.recipes.registry import RecipeRegistry
from service.scheduling.inventory import Inventory, InventoryCache
from service.settings import Settings
from service.store.db import Database

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Services:
    """What one replica runs on; built once when the app starts (``app.build_services``)."""

    settings: Settings
    db: Database
    registry: RecipeRegistry
    broker: Broker
    ray: RayJobs
    inventory: InventoryCache
    loops: Mapping[str, Loop]
    follower: Follower | None

    def wake(self, name: str) -> None:
        if name in self.loops:
            self.loops[name].wake()


def get_services(request: Request) -> Services:
    services: Services = request.app.state.services
    return services


def get_session(services: Annotated[Services, Depends(get_services)]) -> Iterator[Session]:
    """The request's one transaction: committed before the response is sent."""
    with services.db.transaction() as session:
        yield session


ServicesDep = Annotated[Services, Depends(get_services)]


def get_inventory(services: ServicesDep) -> Inventory | None:
    """The cached cluster inventory, or None while Ray cannot be read.

    Declare it before the session in a route, so the Ray call never runs inside a transaction.
    """
    try:
        return services.inventory.get()
    except (RayUnavailable, RayRejected) as exc:
        log.warning("cluster inventory unavailable: %s", exc)
        return None


InventoryDep = Annotated[Inventory | None, Depends(get_inventory)]
# scope="function": the transaction commits before the response is sent (durable first).
SessionDep = Annotated[Session, Depends(get_session, scope="function")]
