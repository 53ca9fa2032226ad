"""What an operation runs on: the replica's settings, database, recipes, secrets, cluster
inventory and loops (``service.api.deps.Services`` is one)."""

from __future__ import annotations

from typing import Protocol

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

    def cluster(self) -> Inventory | None:
        """The cached cluster inventory, or None while Ray cannot be read (it may call Ray:
        never inside a transaction)."""
        ...

    def wake(self, name: str) -> None:
        """Run a loop's next tick now."""
        ...
