"""Open mode (auth off, listening on loopback only): what keeps a browser on this machine from
being turned against the service.

- ``Host`` must name this machine (127.0.0.1, localhost, [::1], any port; or a name the
  operator adds): a page of another site whose name is made to resolve to 127.0.0.1 (DNS
  rebinding) would otherwise talk to the service as if from its own origin.
- A request that changes state from another site (``Origin`` other than the service's own, or
  ``Sec-Fetch-Site: cross-site``) is a 403: any page could otherwise post a form that cancels.

Tokens are not minted over HTTP in open mode (``POST /tokens`` is a 403; ``rlrun token create``
on the host makes them), so no anonymous caller makes itself an admin for when auth is on.
"""

from __future__ import annotations

from collections.abc import Iterable

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from service.api.problems import problem_response
from service.errors import Forbidden, InvalidHost, ProblemError

LOOPBACK_NAMES = frozenset({"127.0.0.1", "localhost", "[::1]"})
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def host_name(host: str) -> str:
    """The name of a ``Host`` header, without its port, lower case (``[::1]`` keeps brackets)."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[: host.find("]") + 1] if "]" in host else host
    name, _, port = host.rpartition(":")
    return name if name and port.isdigit() else host


class OpenModeGuard:
    def __init__(self, app: ASGIApp, extra_hosts: Iterable[str] = ()) -> None:
        self.app = app
        self.hosts = LOOPBACK_NAMES | {h.strip().lower() for h in extra_hosts}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        host = headers.get("host", "")
        refusal: ProblemError | None = None
        if host_name(host) not in self.hosts:
            refusal = InvalidHost(
                "without authentication the service answers only for this machine's loopback "
                "names (127.0.0.1, localhost, [::1])"
            )
        elif scope["method"] not in SAFE_METHODS and cross_site(
            headers, f"{scope['scheme']}://{host}"
        ):
            refusal = Forbidden("a request from another site may not change anything")
        if refusal is None:
            await self.app(scope, receive, send)
        else:
            await problem_response(refusal, scope["path"])(scope, receive, send)


def cross_site(headers: Headers, own_origin: str) -> bool:
    origin = headers.get("origin")
    if origin is not None and origin.strip().lower() != own_origin.lower():
        return True
    return headers.get("sec-fetch-site", "").strip().lower() == "cross-site"
