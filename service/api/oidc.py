"""Bearer JWTs from an OpenID Connect provider, verified with PyJWT against the provider's JWKS.

A token is accepted when its signature verifies with the published key its ``kid`` names, by an
allowed public-key algorithm, and its ``exp``/``nbf``/``iat`` (with leeway), ``iss`` and ``aud``
hold. Its user, team and role come from configured claims. Keys are fetched (blocking: call
``verify`` on a worker thread), cached by ``PyJWKClient`` and fetched again when they expire or
a token names an unknown ``kid``. Revocation is the provider's: tokens live until ``exp``.
Refusals give a fixed reason: never the token or what it claims.
"""

from __future__ import annotations

import hashlib
import logging
import re
import threading
import time
from dataclasses import dataclass
from typing import Any

import httpx
import jwt
from jwt import PyJWK, PyJWKClient, PyJWKClientConnectionError, PyJWKClientError, PyJWKSetError

from service.errors import Unauthorized, Unavailable
from service.settings import Settings, is_secure_url
from service.store.tokens import ROLES, Role

log = logging.getLogger(__name__)

# Three base64url parts (the signature may be empty): API tokens (``rlrun_...``) have no dots.
_JWT = re.compile(r"[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]*")
# What a team and a user may be, as for API tokens.
_TEAM = re.compile(r"[a-z0-9][a-z0-9_-]{0,63}")
_USER = re.compile(r"[^\x00-\x1f\x7f]{1,200}")
REQUIRED_CLAIMS = ("exp", "iat", "iss", "aud", "sub")
FETCH_TIMEOUT_S = 5.0
KEYS_LIFESPAN_S = 300.0
UNAVAILABLE = "the identity provider's signing keys cannot be fetched; retry shortly"


def is_jwt(credential: str) -> bool:
    return _JWT.fullmatch(credential) is not None


@dataclass(frozen=True)
class Identity:
    user: str
    team: str
    role: Role
    # "oidc:" and a digest of issuer and subject: stable per caller, not secret, fits the audit.
    id: str


class OidcVerifier:
    """One per replica; thread-safe."""

    def __init__(self, settings: Settings) -> None:
        if settings.oidc_issuer is None or settings.oidc_audience is None:
            raise ValueError("OIDC needs an issuer and an audience")
        self.issuer = settings.oidc_issuer
        self.audience = settings.oidc_audience
        self.algorithms = list(settings.oidc_algorithms)
        self.user_claim = settings.oidc_user_claim
        self.team_claim = settings.oidc_team_claim
        self.role_claim = settings.oidc_role_claim
        self.leeway_s = settings.oidc_leeway_s
        url = settings.oidc_jwks_url
        self._jwks = self._client(url) if url else None
        self._discovering = threading.Lock()
        # After a failed fetch, callers are answered 503 at once for the Retry-After it gives,
        # rather than each holding a worker thread for a fetch timeout.
        self._down_until = 0.0

    def verify(self, token: str) -> Identity:
        header = _header(token)
        if header.get("alg") not in self.algorithms:
            raise Unauthorized("the token's signing algorithm is not accepted")
        kid = header.get("kid")
        if not isinstance(kid, str) or not kid:
            raise Unauthorized("the token names no signing key (kid)")
        key = self._key(kid)
        try:
            claims = jwt.decode(
                token,
                key,
                algorithms=self.algorithms,
                audience=self.audience,
                issuer=self.issuer,
                leeway=self.leeway_s,
                options={"require": list(REQUIRED_CLAIMS), "enforce_minimum_key_length": True},
            )
        except jwt.PyJWTError as exc:
            raise Unauthorized(_reason(exc)) from None
        return self._identity(claims)

    def _identity(self, claims: dict[str, Any]) -> Identity:
        user, team = claims.get(self.user_claim), claims.get(self.team_claim)
        role = claims.get(self.role_claim)
        if not isinstance(user, str) or not _USER.fullmatch(user):
            raise Unauthorized(f"the token has no usable {self.user_claim!r} claim")
        if not isinstance(team, str) or not _TEAM.fullmatch(team):
            raise Unauthorized(f"the token has no usable {self.team_claim!r} claim")
        if role not in ROLES:
            raise Unauthorized(f"the token's {self.role_claim!r} claim is not {', '.join(ROLES)}")
        subject = hashlib.sha256(f"{self.issuer}\0{claims['sub']}".encode()).hexdigest()
        return Identity(user=user, team=team, role=role, id=f"oidc:{subject[:32]}")

    def _key(self, kid: str) -> PyJWK:
        if time.monotonic() < self._down_until:
            raise Unavailable(UNAVAILABLE)
        jwks = self._jwks or self._discovered()
        try:
            jwks.get_signing_keys()  # the provider's set, fetched unless cached
        except PyJWKClientConnectionError as exc:
            raise self._down(exc) from None
        except (PyJWKClientError, PyJWKSetError) as exc:
            log.warning("the identity provider's JWKS holds no usable signing key: %s", exc)
            raise Unavailable("the identity provider publishes no usable signing key") from None
        try:
            return jwks.get_signing_key(kid)  # fetched again once for an unknown kid
        except PyJWKClientConnectionError as exc:
            raise self._down(exc) from None
        except (PyJWKClientError, PyJWKSetError):
            raise Unauthorized("the token's key is not one the provider publishes") from None

    def _discovered(self) -> PyJWKClient:
        """The client for the JWKS named by the provider's discovery document, read once."""
        with self._discovering:
            if self._jwks is None:
                if time.monotonic() < self._down_until:
                    raise Unavailable(UNAVAILABLE)
                self._jwks = self._client(self._discover())
            return self._jwks

    def _discover(self) -> str:
        url = self.issuer.rstrip("/") + "/.well-known/openid-configuration"
        try:
            answer = httpx.get(url, timeout=FETCH_TIMEOUT_S)
            answer.raise_for_status()
            document = answer.json()
        except (httpx.HTTPError, ValueError) as exc:
            raise self._down(exc) from None
        if not isinstance(document, dict) or document.get("issuer") != self.issuer:
            log.warning("%s: not the discovery document of issuer %s", url, self.issuer)
            raise Unavailable("the identity provider's discovery document does not fit")
        jwks_uri = document.get("jwks_uri")
        if not isinstance(jwks_uri, str) or not is_secure_url(jwks_uri):
            log.warning("%s: jwks_uri is missing, or neither https nor on loopback", url)
            raise Unavailable("the identity provider's discovery document does not fit")
        return jwks_uri

    def _client(self, url: str) -> PyJWKClient:
        return PyJWKClient(url, lifespan=KEYS_LIFESPAN_S, timeout=FETCH_TIMEOUT_S)

    def _down(self, exc: Exception) -> Unavailable:
        log.warning("identity provider unreachable: %s", exc)
        self._down_until = time.monotonic() + Unavailable.retry_after_s
        return Unavailable(UNAVAILABLE)


def _header(token: str) -> dict[str, Any]:
    try:
        return jwt.get_unverified_header(token)
    except jwt.PyJWTError:
        raise Unauthorized("the token is not a well-formed JWT") from None


def _reason(exc: jwt.PyJWTError) -> str:
    """What was wrong, in fixed words: library messages may quote the token."""
    if isinstance(exc, jwt.ExpiredSignatureError):
        return "the token has expired"
    if isinstance(exc, jwt.ImmatureSignatureError):
        return "the token is not valid yet"
    if isinstance(exc, jwt.InvalidIssuerError):
        return "the token is from another issuer"
    if isinstance(exc, jwt.InvalidAudienceError):
        return "the token is meant for another audience"
    if isinstance(exc, jwt.MissingRequiredClaimError) and exc.claim in REQUIRED_CLAIMS:
        return f"the token lacks the {exc.claim!r} claim"
    if isinstance(exc, jwt.InvalidSignatureError):
        return "the token's signature does not verify"
    return "the token is not valid"
