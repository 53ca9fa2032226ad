"""Who is calling: a bearer token resolved to a ``Principal`` on every request, and what its role
allows. Tokens travel only in the ``Authorization`` header (no cookies, so no CSRF surface): an
API token (looked up by its hash), or with OIDC configured an identity provider's JWT (verified
against the provider's keys; its claims name user, team and role).

Roles: ``viewer`` reads its team's runs; ``member`` also submits for its team and cancels its
team's runs; ``admin`` reads and cancels any run, submits for any team, and manages tokens and
reads the audit trail. Another team's run is a 404 to a non-admin, as if it did not exist. With
auth off (open mode) every caller is an anonymous admin.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated

from fastapi import Depends, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session

from service.api.deps import Services, ServicesDep
from service.api.oidc import Identity, is_jwt
from service.errors import Forbidden, Unauthorized
from service.principal import Principal as Principal
from service.principal import ensure_sees as ensure_sees
from service.principal import record_call
from service.principal import require_visible as require_visible
from service.principal import visible_run as visible_run
from service.store import tokens
from service.store.tokens import Role

bearer = HTTPBearer(
    auto_error=False,
    description="an API token from `rlrun token create`, or the identity provider's JWT (OIDC)",
)
CredentialsDep = Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]


ANONYMOUS = Principal(user="anonymous", team=None, role="admin")
# Where a caller already resolved at the door (before a body is read) waits for the route.
PRINCIPAL_KEY = "rlrun.principal"


def from_identity(identity: Identity) -> Principal:
    # Keyed (limits, idempotency, audit) by issuer and subject, as an API token by its id.
    return Principal(
        user=identity.user, team=identity.team, role=identity.role, token_id=identity.id
    )


async def resolve(
    services: Services, credentials: HTTPAuthorizationCredentials | None, client: str | None
) -> Principal:
    """The caller. An API token is one indexed row, read on the event loop
    (``tokens.find_active``: no worker thread for the hottest check), then trusted for
    ``signin_cache_s`` unless revoked (``TokenCache``); a JWT is verified on a worker thread (the
    provider's keys may need fetching). A credential that does not sign in is a 401 and is recorded
    (``sign_in_audit``: counted here, its row written on a worker thread) for ``client``."""
    if not services.settings.auth_enabled:
        return ANONYMOUS
    if credentials is None:
        raise Unauthorized()
    secret = credentials.credentials
    try:
        if services.oidc is not None and is_jwt(secret):
            return from_identity(await run_in_threadpool(services.oidc.verify, secret))
        digest = tokens.digest(secret)
        if (known := services.signed_in.get(digest)) is not None:
            return known
        ticket = services.signed_in.ticket()
        row = await tokens.find_active(services.db, digest)
        if row is None:
            raise Unauthorized("the API token is unknown or revoked")
    except Unauthorized as exc:
        # Counted on the loop; only a due row (one a minute per network) takes a thread.
        if due := services.sign_ins.failed(client):
            await run_in_threadpool(services.sign_ins.write, services.db, client, exc.detail, due)
        raise
    principal = Principal(user=row.user, team=row.team, role=row.role, token_id=row.id)
    services.signed_in.keep(digest, principal, ticket)
    return principal


def known_caller(services: Services, authorization: str | None) -> Principal | None:
    """The caller of an ``Authorization`` header if known without a read: anyone in open mode,
    an API token ``resolve`` let in within ``signin_cache_s``; else None (``resolve`` decides)."""
    if not services.settings.auth_enabled:
        return ANONYMOUS
    scheme, _, secret = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not secret or is_jwt(secret):
        return None
    return services.signed_in.get(tokens.digest(secret))


async def current_principal(
    services: ServicesDep, credentials: CredentialsDep, request: Request
) -> Principal:
    """The caller (``resolve``); open mode reads nothing. A request with a body was resolved
    at the door already."""
    known = request.scope.get(PRINCIPAL_KEY)
    if isinstance(known, Principal):
        return known
    return await resolve(services, credentials, client_of(request))


def requires(role: Role) -> Callable[[Principal], Awaitable[Principal]]:
    async def check(principal: Annotated[Principal, Depends(current_principal)]) -> Principal:
        if not principal.at_least(role):
            raise Forbidden(f"this needs the {role} role; the token's role is {principal.role}")
        return principal

    return check


Viewer = Annotated[Principal, Depends(requires("viewer"))]
Member = Annotated[Principal, Depends(requires("member"))]
Admin = Annotated[Principal, Depends(requires("admin"))]


def client_of(request: Request) -> str | None:
    """The peer's address: the socket's, or with ``RLRUN_FORWARDED_ALLOW_IPS`` naming the peer
    (a trusted proxy), the one its ``X-Forwarded-For`` gives (uvicorn rewrites it)."""
    return f"{request.client.host}:{request.client.port}" if request.client else None


def audited(
    session: Session,
    request: Request,
    principal: Principal,
    action: str,
    run_id: str | None = None,
    target: str | None = None,
) -> None:
    """Record a state-changing call in the caller's transaction (it commits with the change)."""
    record_call(session, principal, client_of(request), action, run_id, target)
