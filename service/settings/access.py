"""Sections of who may do what: authentication (API tokens, open mode, OIDC) and the
secrets a spec names."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from service.settings.base import PUBLIC_KEY_ALGORITHMS, Names, Section, is_secure_url


class AuthSettings(Section):
    """Identity: API tokens, open mode, and OpenID Connect.

    OIDC accepts bearer JWTs of an identity provider beside API tokens; it is on when issuer and
    audience are both set. Keys come from the JWKS URL, or else from the provider's discovery
    document (<issuer>/.well-known/openid-configuration). Only public-key algorithms."""

    heading: ClassVar[str] = "Authentication"

    auth: Literal["auto", "on", "off"] = "auto"
    """"auto": on unless the service listens only on loopback (``listen_host``, set by
    ``rlrun serve --host``); "on"; "off" (open: every caller is an anonymous admin)."""
    signin_cache_s: float = Field(default=1.0, ge=0)
    """How long an API token that signed in is trusted again without reading the database. A
    revocation ends it at once on the replica that made it and, on PostgreSQL, on the others
    (told by NOTIFY); ``rlrun token revoke`` answers once this long has passed, so that the
    token is refused everywhere. 0: every request reads its token."""
    open_mode_hosts: Names = []
    """Open mode answers only for loopback Host names (127.0.0.1, localhost, [::1]), these, and
    the names allowed_hosts lists (exact names; its "*" patterns do not count)."""
    oidc_issuer: str | None = None
    """The provider's issuer URL (the tokens' "iss")."""
    oidc_audience: str | None = None
    """The audience the tokens must name ("aud")."""
    oidc_jwks_url: str | None = None
    """Where the provider's keys are (unset: from its discovery document)."""
    oidc_algorithms: Names = ["RS256", "ES256"]
    """Signature algorithms accepted (public-key ones only)."""
    oidc_user_claim: str = Field(default="sub", min_length=1)
    """The claim naming the user: "sub" by default, the one claim OIDC makes stable and unique
    per issuer (an email may change hands or be absent from access tokens)."""
    oidc_team_claim: str = Field(default="team", min_length=1)
    """The claim naming the caller's team."""
    oidc_role_claim: str = Field(default="role", min_length=1)
    """The claim naming the caller's role."""
    oidc_leeway_s: float = Field(default=30.0, ge=0, le=300)
    """Clock skew allowed on a token's times (exp, nbf, iat)."""

    @field_validator("oidc_issuer", "oidc_audience", "oidc_jwks_url")
    @classmethod
    def _oidc_names(cls, value: str | None, info: ValidationInfo) -> str | None:
        value = (value or "").strip() or None
        if value and info.field_name != "oidc_audience" and not is_secure_url(value):
            raise ValueError("expected an https:// URL (http:// only on loopback)")
        return value

    @field_validator("oidc_algorithms")
    @classmethod
    def _public_key_algorithms(cls, names: list[str]) -> list[str]:
        if not names:
            raise ValueError("expected at least one algorithm, e.g. 'RS256,ES256'")
        for name in names:
            if name not in PUBLIC_KEY_ALGORITHMS:
                raise ValueError(
                    f"{name!r} is not accepted: only public-key algorithms verify a provider's "
                    f"tokens ({', '.join(PUBLIC_KEY_ALGORITHMS)})"
                )
        return names

    @model_validator(mode="after")
    def _oidc_complete(self) -> AuthSettings:
        if (self.oidc_issuer is None) != (self.oidc_audience is None):
            raise ValueError(
                "RLRUN_OIDC_ISSUER and RLRUN_OIDC_AUDIENCE go together: both turn OIDC on, "
                "neither leaves it off"
            )
        if self.oidc_jwks_url and not self.oidc_enabled:
            raise ValueError("RLRUN_OIDC_JWKS_URL needs RLRUN_OIDC_ISSUER and RLRUN_OIDC_AUDIENCE")
        if self.oidc_enabled and self.auth == "off":
            raise ValueError("OIDC is configured but RLRUN_AUTH=off would let every caller in")
        return self

    @property
    def oidc_enabled(self) -> bool:
        return self.oidc_issuer is not None and self.oidc_audience is not None


class SecretSettings(Section):
    """Secrets a spec names by reference, and the grant a job redeems them with."""

    heading: ClassVar[str] = "Secrets and grants"

    secrets_dir: str | None = None
    """Files <dir>/teams/<team>/<name> or <dir>/shared/<name>; besides them, env vars
    RLRUN_SECRET_<NS>__<NAME> / RLRUN_SHARED_SECRET_<NAME> (service.team_secrets)."""
    grant_ttl_s: float = Field(default=3600.0, gt=0, le=86_400)
    """How long a job has to redeem its grant after it is submitted (its runtime env set up,
    pip included); a redeemed grant, or one whose run is over, is refused sooner."""
