"""What an operation runs on: the replica's settings, database, recipes, secrets, clusters
(their inventories) and loops (``service.api.deps.Services`` is one)."""

from __future__ import annotations

from typing import Protocol

from service.cluster.registry import Clusters
from service.recipes.registry import RecipeRegistry
from service.scheduling.inventory import Inventory
from service.settings import Settings
from service.store.db import Database
from service.team_secrets import SecretStore


class Parts(Protocol):
    @property
    def settings(self) -> Settings: ...

    @property
    def db(self) -> Database: ...

    @property
    def registry(self) -> RecipeRegistry: ...

    @property
    def secrets(self) -> SecretStore: ...

    @property
    def clusters(self) -> Clusters: ...

    def cluster(self, name: str | None = None) -> Inventory | None:
        """The cached inventory of cluster ``name`` (None: the primary), or None while it
        cannot be read (it may call Ray: never inside a transaction)."""
        ...

    def wake(self, name: str) -> None:
        """Run a loop's next tick now."""
        ...
