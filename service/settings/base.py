"""What every section of the settings is made of: ``Section``, the list types (``Names``,
``Counts``: a JSON list or items between commas), and the address checks settings validate
with."""

from __future__ import annotations

import functools
import ipaddress
import json
from typing import Annotated, ClassVar
from urllib.parse import urlsplit

from pydantic import BaseModel, BeforeValidator, ConfigDict, NonNegativeInt
from pydantic_settings import NoDecode


def _items(value: object) -> object:
    """A list setting as given: a JSON list (``'["a", "b"]'``), or items separated by commas
    (``a,b``; spaces around them and empty ones dropped; ``[::1],localhost`` is two items)."""
    if not isinstance(value, str):
        return value
    text = value.strip()
    if text.startswith("["):
        try:
            return json.loads(text)
        except ValueError:
            if '"' in text:  # meant as JSON: its error, not a guess
                raise
    return [item.strip() for item in text.split(",") if item.strip()]


# Every list setting is one of these: read raw from the environment (NoDecode), then ``_items``.
Names = Annotated[list[str], NoDecode, BeforeValidator(_items)]
Counts = Annotated[list[NonNegativeInt], NoDecode, BeforeValidator(_items)]


class Section(BaseModel):
    """A group of settings (a table of the docs' settings page, under ``heading``); the
    docstring under each field is its description."""

    model_config = ConfigDict(use_attribute_docstrings=True)
    heading: ClassVar[str] = ""


# What a provider's JWKS may sign with: asymmetric only, so a public key can never verify a MAC.
PUBLIC_KEY_ALGORITHMS = (
    "RS256",
    "RS384",
    "RS512",
    "PS256",
    "PS384",
    "PS512",
    "ES256",
    "ES384",
    "ES512",
    "EdDSA",
)


def is_secure_url(url: str) -> bool:
    """https, or http to this machine only: keys fetched in clear text could be swapped."""
    try:
        parts = urlsplit(url)
        host = parts.hostname
    except ValueError:
        return False
    if not host:
        return False
    return parts.scheme == "https" or (parts.scheme == "http" and is_loopback(host))


@functools.lru_cache(maxsize=64)
def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or name to bind) reaches only this machine (kept: every
    request asks whether auth is on)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
