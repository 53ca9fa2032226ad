"""Service settings, read once from the environment (prefix ``RLRUN_``).

Grouped in sections, one small class each (its fields, what each means in the docstring under it),
kept by theme in this package's modules; ``Settings`` composes them, so every setting keeps its flat
name (``RLRUN_RAY_ADDRESS``, ``settings.ray_address``). A new setting goes into the section it
belongs to; the settings page of the docs is generated from the sections (``python -m
tests.docs_reference``). A list setting is given as a JSON list or as items separated by commas. A
credential is a ``SecretStr``: shown masked in any repr, dump or log, its value read
(``get_secret_value()``) where it is used."""

from __future__ import annotations

import hashlib
import os

from pydantic_settings import BaseSettings, SettingsConfigDict
from sqlalchemy.engine import make_url

from service.settings.access import AuthSettings, SecretSettings
from service.settings.base import (
    PUBLIC_KEY_ALGORITHMS,
    Counts,
    Names,
    Section,
    is_loopback,
    is_secure_url,
)
from service.settings.cluster import LocalClusterSettings, RaySettings
from service.settings.runs import (
    AdmissionSettings,
    LimitSettings,
    LoopSettings,
    RecipeSettings,
    RetrySettings,
    StopSettings,
)
from service.settings.server import DatabaseSettings, ServerSettings
from service.settings.sharing import FairShareSettings, PreemptionSettings
from service.settings.signals import MetricsSettings, WebhookSettings
from service.settings.verl import VerlSettings

__all__ = [
    "PUBLIC_KEY_ALGORITHMS",
    "Counts",
    "Names",
    "Section",
    "Settings",
    "is_loopback",
    "is_secure_url",
    "sections",
]


class Settings(
    DatabaseSettings,
    ServerSettings,
    RaySettings,
    LocalClusterSettings,
    AuthSettings,
    SecretSettings,
    RecipeSettings,
    LimitSettings,
    AdmissionSettings,
    FairShareSettings,
    PreemptionSettings,
    LoopSettings,
    RetrySettings,
    StopSettings,
    MetricsSettings,
    WebhookSettings,
    VerlSettings,
    BaseSettings,
):
    """Everything a deployment configures by name; built once and handed to ``create_app``.
    Its sections, in the order the docs show them, are its bases (``sections()``)."""

    model_config = SettingsConfigDict(env_prefix="RLRUN_", extra="ignore")

    # What follows needs settings of two sections.

    @property
    def open_mode_host_names(self) -> list[str]:
        named = [h for h in self.allowed_hosts if "*" not in h]
        return [*self.open_mode_hosts, *named]

    @property
    def instance_name(self) -> str:
        """This service's name on its host (``instance``), else 8 hex digits of its database's
        identity: the URL without its password, a SQLite file by its absolute path."""
        if self.instance:
            return self.instance
        url = make_url(self.database_url.get_secret_value())
        if url.drivername.startswith("sqlite") and url.database and url.database != ":memory:":
            url = url.set(database=os.path.abspath(url.database))
        who = url.render_as_string(hide_password=True)
        return hashlib.sha256(who.encode()).hexdigest()[:8]

    @property
    def auth_enabled(self) -> bool:
        if self.auth != "auto":
            return self.auth == "on"
        return not is_loopback(self.listen_host)


def sections() -> list[type[Section]]:
    """The sections ``Settings`` is made of, in order."""
    return [base for base in Settings.__bases__ if issubclass(base, Section)]
