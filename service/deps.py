"""What routes depend on: the app's services, and one DB transaction per request."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Annotated

from fastapi import Depends, Request
from sqlalchemy.orm import Session

from service.db import Database
from service.loops.base import Loop
from service.loops.follower import Follower
from service.metrics.broker import Broker
from service.ray_jobs import RayJobs
from service.recipes.registry import RecipeRegistry
from service.settings import Settings


@dataclass
class Services:
    settings: Settings
    db: Database
    registry: RecipeRegistry
    broker: Broker
    ray: RayJobs | None = None
    loops: dict[str, Loop] = field(default_factory=dict)
    follower: Follower | None = None

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
# scope="function": the transaction commits before the response is sent (durable first).
SessionDep = Annotated[Session, Depends(get_session, scope="function")]
