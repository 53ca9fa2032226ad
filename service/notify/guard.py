"""Where a webhook may call: never the service's own network unless the operator says so.

A URL is http(s) with a host and no credentials. Its host is resolved, and every address it
resolves to must be public (not loopback, link-local, private, shared, multicast, reserved or
a cloud metadata address) unless the operator's allow-list (``RLRUN_WEBHOOK_ALLOW``: host
names or CIDRs) names it. The sender then connects to the address it checked, not to a second
resolution of the name (no rebinding in between), and never follows a redirect.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Resolver = Callable[[str, int], list[str]]


class UnsafeUrl(ValueError):
    """A URL a webhook may not call (the message says why, naming no resolved address)."""


@dataclass(frozen=True)
class Target:
    """A checked URL: where to connect (an address literal) and what to call it there."""

    url: str
    scheme: str
    host: str
    port: int
    address: str


def system_resolver(host: str, port: int) -> list[str]:
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [str(info[4][0]) for info in infos]


@dataclass(frozen=True)
class AllowList:
    hosts: frozenset[str]
    networks: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]

    @classmethod
    def parse(cls, entries: Sequence[str]) -> AllowList:
        hosts, networks = set(), []
        for entry in (e.strip() for e in entries):
            if not entry:
                continue
            try:
                networks.append(ipaddress.ip_network(entry, strict=False))
            except ValueError:
                hosts.add(entry.lower().rstrip("."))
        return cls(frozenset(hosts), tuple(networks))

    def admits(self, host: str, address: Address) -> bool:
        return host in self.hosts or any(address in net for net in self.networks)


_NAT64 = ipaddress.ip_network("64:ff9b::/96")  # RFC 6052: the IPv4 address in the last 32 bits
_LOCAL_NAT64 = ipaddress.ip_network("64:ff9b:1::/48")  # RFC 8215: local use only
_TRANSLATED = ipaddress.ip_network("::ffff:0:0:0/96")  # RFC 2765: IPv4-translated
_COMPATIBLE = ipaddress.ip_network("::/96")  # RFC 4291 (deprecated): IPv4-compatible


def _embedded(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 one carries (mapped, 6to4, Teredo's client, NAT64,
    IPv4-translated, IPv4-compatible), which is where a packet to it may end up."""
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    if address.teredo is not None:
        return address.teredo[1]
    if any(address in net for net in (_NAT64, _TRANSLATED, _COMPATIBLE)):
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return None


def _public(address: Address) -> bool:
    if isinstance(address, ipaddress.IPv6Address):
        if address.is_site_local or address in _LOCAL_NAT64:
            return False
        inner = _embedded(address)
        if inner is not None:
            return _public(inner)
    return address.is_global and not address.is_multicast


def check(url: str, allow: AllowList, resolve: Resolver = system_resolver) -> Target:
    """The URL checked and resolved; ``UnsafeUrl`` if a webhook may not call it."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise UnsafeUrl("the URL must be http or https")
    if parts.username is not None or parts.password is not None:
        raise UnsafeUrl("the URL may not carry credentials")
    host = (parts.hostname or "").lower().rstrip(".")
    if not host:
        raise UnsafeUrl("the URL has no host")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError as exc:
        raise UnsafeUrl("the URL's port is not a port") from exc
    try:
        found = resolve(host, port)
    except OSError as exc:
        raise UnsafeUrl(f"the host {host!r} does not resolve") from exc
    if not found:
        raise UnsafeUrl(f"the host {host!r} does not resolve")
    addresses = [ipaddress.ip_address(a.split("%", 1)[0]) for a in found]
    refused = [a for a in addresses if not (_public(a) or allow.admits(host, a))]
    if refused:
        raise UnsafeUrl(
            f"the host {host!r} is on a loopback, private, link-local or reserved network; "
            "an operator may allow it in RLRUN_WEBHOOK_ALLOW"
        )
    return Target(url, parts.scheme, host, port, str(addresses[0]))
