"""OIDC bearer tokens beside API tokens: a provider's keys served over HTTP by a real server,
tokens signed with PyJWT, the real app verifying them (roles, teams, refusals, an unreachable
provider, per-caller limits, the audit trail) and the settings that turn it on."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from fastapi import FastAPI, Response
from fastapi.testclient import TestClient
from jwt.algorithms import ECAlgorithm, RSAAlgorithm
from pydantic import ValidationError
from typer.testing import CliRunner

from service.app import create_app
from service.cli import app as cli
from service.settings import Settings
from service.store.db import Database, upgrade
from service.store.tokens import create as create_token
from tests.conftest import make_settings, wait_for
from tests.live import ServerThread
from tests.test_auth import Caller, check_role_matrix, submit

TEAM, OTHER = "vision", "speech"
AUDIENCE = "rlrun-api"
RSA_KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)
EC_KEY = ec.generate_private_key(ec.SECP256R1())
# Never published: tokens it signs must be refused whatever kid they name.
STRANGER = rsa.generate_private_key(public_exponent=65537, key_size=2048)


def public_pem(key: rsa.RSAPrivateKey) -> bytes:
    return key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


class Provider:
    """An identity provider's discovery document and JWKS (an RSA and an EC key), served by a
    real HTTP server; ``hits`` counts JWKS fetches, ``broken`` makes them answer 500."""

    def __init__(self) -> None:
        self.hits = 0
        self.broken = False
        app = FastAPI()

        @app.get("/.well-known/openid-configuration")
        def discovery() -> dict[str, str]:
            return {"issuer": self.issuer, "jwks_uri": self.jwks_url}

        @app.get("/jwks.json")
        def jwks() -> Any:
            self.hits += 1
            if self.broken:
                return Response(status_code=500)
            rsa_jwk = RSAAlgorithm.to_jwk(RSA_KEY.public_key(), as_dict=True)
            ec_jwk = ECAlgorithm.to_jwk(EC_KEY.public_key(), as_dict=True)
            return {
                "keys": [
                    rsa_jwk | {"kid": "rsa-1", "use": "sig", "alg": "RS256"},
                    ec_jwk | {"kid": "ec-1", "use": "sig", "alg": "ES256"},
                ]
            }

        self.server = ServerThread(app)
        self.issuer = f"http://127.0.0.1:{self.server.port}"
        self.jwks_url = f"{self.issuer}/jwks.json"

    def __enter__(self) -> Provider:
        self.server.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.__exit__(*exc)

    def token(
        self, key: Any = RSA_KEY, kid: str = "rsa-1", alg: str = "RS256", **claims: Any
    ) -> str:
        """A token of a member of TEAM unless ``claims`` say otherwise (None: left out)."""
        now = int(time.time())
        payload = {
            "iss": self.issuer,
            "aud": AUDIENCE,
            "sub": "alice-sub",
            "team": TEAM,
            "role": "member",
            "iat": now,
            "exp": now + 300,
        } | claims
        payload = {k: v for k, v in payload.items() if v is not None}
        return jwt.encode(payload, key, algorithm=alg, headers={"kid": kid})

    def hs256_with_public_key(self) -> str:
        """The algorithm-confusion attack: a MAC keyed with the published RSA key's PEM."""
        now = int(time.time())
        header = b64(json.dumps({"alg": "HS256", "typ": "JWT", "kid": "rsa-1"}).encode())
        claims = {"iss": self.issuer, "aud": AUDIENCE, "sub": "mallory-sub", "team": TEAM}
        claims |= {"role": "admin", "iat": now, "exp": now + 300}
        body = b64(json.dumps(claims).encode())
        mac = hmac.new(public_pem(RSA_KEY), f"{header}.{body}".encode(), hashlib.sha256)
        return f"{header}.{body}.{b64(mac.digest())}"


@pytest.fixture
def provider() -> Iterator[Provider]:
    with Provider() as p:
        yield p


def oidc_settings(db_url: str, provider: Provider, **overrides: Any) -> Settings:
    return make_settings(
        db_url,
        "http://127.0.0.1:9",
        run_loops=False,
        auth="on",
        oidc_issuer=provider.issuer,
        oidc_audience=AUDIENCE,
        **overrides,
    )


def api_token(db_url: str, user: str, team: str, role: str) -> str:
    db = Database(db_url)
    with db.transaction() as s:
        _, secret = create_token(s, user, team, role)  # type: ignore[arg-type]
    db.dispose()
    return secret


@pytest.fixture
def oidc(db_url: str, provider: Provider) -> Iterator[dict[str, Any]]:
    """The app with OIDC on (keys found by discovery), provider callers of TEAM by role, and an
    API token's member and admin of OTHER."""
    with TestClient(create_app(oidc_settings(db_url, provider))) as client:
        callers = {
            "viewer": Caller(client, provider.token(sub="vera-sub", role="viewer")),
            "member": Caller(client, provider.token(sub="alice-sub")),
            # Signed with the EC key: ES256 is allowed by default too.
            "admin": Caller(
                client, provider.token(EC_KEY, "ec-1", "ES256", sub="ada-sub", role="admin")
            ),
            "other": Caller(client, api_token(db_url, "otto", OTHER, "member")),
            "other-admin": Caller(client, api_token(db_url, "root", OTHER, "admin")),
            "anonymous": Caller(client, None),
        }
        yield {"client": client, "callers": callers, "provider": provider}


def test_provider_callers_act_for_the_team_and_role_their_token_names(
    oidc: dict[str, Any],
) -> None:
    c = oidc["callers"]
    made = submit(c["member"])
    assert made.status_code == 201 and made.json()["team"] == TEAM
    own = made.json()["id"]
    other = submit(c["other"]).json()["id"]  # an API token still works beside OIDC
    check_role_matrix(c, own, other)
    assert submit(c["viewer"]).status_code == 403
    refused = submit(c["member"], team=OTHER)
    assert refused.status_code == 403 and refused.json()["title"] == "Forbidden"
    assert submit(c["admin"], team=OTHER).json()["team"] == OTHER

    def teams(who: str, **params: str) -> set[str]:
        return {r["team"] for r in c[who].get("/runs", params=params).json()["items"]}

    assert teams("member", team=OTHER) == teams("viewer") == {TEAM}
    assert teams("admin") == {TEAM, OTHER}
    assert teams("other") == {OTHER}


def test_idempotency_keys_are_per_provider_subject(oidc: dict[str, Any]) -> None:
    c, provider = oidc["callers"], oidc["provider"]
    key = {"Idempotency-Key": "same"}
    first = c["member"].post("/runs", json={"recipe": "test-script"}, headers=key).json()["id"]
    # A fresh token of the same subject is the same caller; another subject is another.
    again = Caller(oidc["client"], provider.token(sub="alice-sub", jti="second"))
    bob = Caller(oidc["client"], provider.token(sub="bob-sub"))
    assert again.post("/runs", json={"recipe": "test-script"}, headers=key).json()["id"] == first
    theirs = bob.post("/runs", json={"recipe": "test-script"}, headers=key)
    assert theirs.status_code == 201 and theirs.json()["id"] != first


def test_refused_tokens_are_401_problems_that_never_quote_the_token(
    oidc: dict[str, Any],
) -> None:
    p: Provider = oidc["provider"]
    now = int(time.time())
    unsigned = jwt.encode(
        {"iss": p.issuer, "aud": AUDIENCE, "sub": "eve-sub", "team": TEAM, "role": "admin"}
        | {"iat": now, "exp": now + 300},
        None,
        algorithm="none",
        headers={"kid": "rsa-1"},
    )
    cases = {
        "expired": p.token(exp=now - 120, iat=now - 600),
        "not yet valid": p.token(nbf=now + 600),
        "issued in the future": p.token(iat=now + 600, exp=now + 900),
        "wrong issuer": p.token(iss="https://idp.example.org/realm-x"),
        "wrong audience": p.token(aud="someone-elses-api"),
        "unknown kid": p.token(STRANGER, kid="rsa-9"),
        "published kid, other key": p.token(STRANGER),
        "alg none": unsigned,
        "HS256 keyed with the public key": p.hs256_with_public_key(),
        "no team": p.token(team=None),
        "malformed team": p.token(team="Team Rocket!"),
        "unknown role": p.token(role="superuser"),
        "no role": p.token(role=None),
        "no exp": p.token(exp=None),
        "no sub": p.token(sub=None),
        "not JSON": "bm90LWpzb24.bm90LWpzb24.c2ln",
    }
    # What the answers must never carry: the tokens' parts and what they claim.
    claimed = ["alice-sub", "eve-sub", "mallory-sub", "idp.example.org", "someone-elses-api"]
    claimed += ["Team Rocket!", "superuser"]
    statuses = {}
    for name, token in cases.items():
        answer = Caller(oidc["client"], token).get("/runs")
        statuses[name] = answer.status_code
        if answer.status_code != 401:
            continue
        assert answer.headers["content-type"] == "application/problem+json", name
        assert answer.headers["www-authenticate"] == "Bearer", name
        assert answer.json()["title"] == "Unauthorized", name
        leaked = [part for part in token.split(".") if len(part) > 4 and part in answer.text]
        leaked += [value for value in claimed if value in answer.text]
        assert not leaked, (name, answer.text)
    assert statuses == dict.fromkeys(cases, 401)
    # Within the clock leeway (30 s), a just-expired token still passes.
    assert Caller(oidc["client"], p.token(exp=now - 10)).get("/runs").status_code == 200


def test_keys_are_fetched_once_and_an_unreachable_provider_is_a_503_to_retry(
    db_url: str, provider: Provider
) -> None:
    explicit = oidc_settings(db_url, provider, oidc_jwks_url=provider.jwks_url)
    token = provider.token()
    with TestClient(create_app(explicit)) as client:
        caller = Caller(client, token)
        assert [caller.get("/runs").status_code for _ in range(3)] == [200, 200, 200]
        assert provider.hits == 1  # cached by the key client
        provider.__exit__(None, None, None)
        assert caller.get("/runs").status_code == 200  # the provider away: the cached keys serve
    with TestClient(create_app(explicit)) as client:  # a fresh replica: no keys yet
        answer = Caller(client, token).get("/runs")
        assert answer.status_code == 503, answer.text
        assert answer.headers["content-type"] == "application/problem+json"
        assert answer.json()["title"] == "Service unavailable"
        assert 1 <= int(answer.headers["retry-after"]) <= 60
        assert not any(part in answer.text for part in token.split("."))
        member = Caller(client, api_token(db_url, "otto", OTHER, "member"))
        assert member.get("/runs").status_code == 200  # API tokens do not need the provider


def test_a_failing_jwks_is_asked_once_per_retry_after(db_url: str, provider: Provider) -> None:
    provider.broken = True
    with TestClient(create_app(oidc_settings(db_url, provider))) as client:
        caller = Caller(client, provider.token())
        answers = [caller.get("/runs") for _ in range(3)]
        assert [a.status_code for a in answers] == [503, 503, 503]
        assert all("retry-after" in a.headers for a in answers)
        assert provider.hits == 1  # the others were answered without a fetch


def test_an_oidc_callers_mutations_are_audited_under_its_user_and_team(
    oidc: dict[str, Any],
) -> None:
    c = oidc["callers"]
    run_id = submit(c["member"]).json()["id"]
    assert c["member"].post(f"/runs/{run_id}/cancel").status_code == 200
    rows = c["other-admin"].get("/audit").json()["items"]
    assert [(r["action"], r["user"], r["team"], r["role"], r["run_id"]) for r in rows] == [
        ("run.cancel", "alice-sub", TEAM, "member", run_id),
        ("run.create", "alice-sub", TEAM, "member", run_id),
    ]
    # A stable id per issuer and subject, not the subject itself.
    assert rows[0]["token_id"] == rows[1]["token_id"]
    assert rows[0]["token_id"].startswith("oidc:") and "alice" not in rows[0]["token_id"]


def test_the_user_claim_is_configurable(db_url: str, provider: Provider) -> None:
    settings = oidc_settings(db_url, provider, oidc_user_claim="email", oidc_team_claim="grp")
    with TestClient(create_app(settings)) as client:
        token = provider.token(email="alice@example.org", team=None, grp=TEAM)
        made = submit(Caller(client, token))
        assert made.status_code == 201 and made.json()["team"] == TEAM
        no_email = Caller(client, provider.token(team=None, grp=TEAM)).get("/runs")
        assert no_email.status_code == 401 and "'email'" in no_email.json()["detail"]
        admin = Caller(client, api_token(db_url, "root", OTHER, "admin"))
        rows = admin.get("/audit").json()["items"]
        assert [r["user"] for r in rows if r["action"] == "run.create"] == ["alice@example.org"]
        assert [r["action"] for r in rows][:1] == ["auth.failed"]  # the token without email


def test_live_streams_count_per_provider_subject(tmp_path: Any, provider: Provider) -> None:
    url = f"sqlite:///{tmp_path}/db.sqlite"
    upgrade(url)
    settings = oidc_settings(url, provider, streams_per_caller=1)
    alice, alice_again = provider.token(), provider.token(jti="again")
    bob = provider.token(sub="bob-sub")
    timeout = httpx.Timeout(10)
    with ServerThread(create_app(settings)) as server:
        made = httpx.post(
            f"{server}/runs", json={"recipe": "test-script"}, headers=bearer(alice)
        ).json()
        events = f"{server}/runs/{made['id']}/events"
        with httpx.stream("GET", events, headers=bearer(alice), timeout=timeout) as first:
            assert first.status_code == 200
            second = httpx.get(events, headers=bearer(alice_again), timeout=timeout)
            assert second.status_code == 429 and "retry-after" in second.headers
            with httpx.stream("GET", events, headers=bearer(bob), timeout=timeout) as theirs:
                assert theirs.status_code == 200

        def reopened() -> int:
            with httpx.stream("GET", events, headers=bearer(alice_again), timeout=timeout) as r:
                return r.status_code

        wait_for(reopened, lambda status: status == 200, timeout=20, every=0.5)


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_the_openapi_document_lists_what_a_token_call_may_answer(oidc: dict[str, Any]) -> None:
    doc = oidc["client"].get("/openapi.json").json()
    answers = doc["paths"]["/runs"]["get"]["responses"]
    assert {"401", "403", "503"} <= set(answers)
    assert "identity provider" in answers["401"]["description"]
    assert "503" not in doc["paths"]["/healthz"]["get"]["responses"]


def test_oidc_is_off_by_default() -> None:
    settings = Settings()
    assert not settings.oidc_enabled
    assert settings.oidc_algorithms == ["RS256", "ES256"]
    assert (settings.oidc_user_claim, settings.oidc_team_claim) == ("sub", "team")
    assert (settings.oidc_role_claim, settings.oidc_leeway_s) == ("role", 30.0)


@pytest.mark.parametrize(
    ("given", "says"),
    [
        ({"oidc_issuer": "https://idp.example.org"}, "go together"),
        ({"oidc_audience": "rlrun"}, "go together"),
        ({"oidc_jwks_url": "https://idp.example.org/jwks"}, "RLRUN_OIDC_JWKS_URL needs"),
        ({"oidc_issuer": "http://idp.example.org", "oidc_audience": "a"}, "https://"),
        (
            {"oidc_issuer": "https://i", "oidc_audience": "a", "oidc_jwks_url": "http://10.0.0.1"},
            "https://",
        ),
        ({"oidc_algorithms": "RS256,HS256"}, "'HS256' is not accepted"),
        ({"oidc_algorithms": "none"}, "'none' is not accepted"),
        ({"oidc_algorithms": " , "}, "at least one algorithm"),
        ({"oidc_issuer": "https://i", "oidc_audience": "a", "auth": "off"}, "RLRUN_AUTH=off"),
        ({"oidc_leeway_s": 3600}, "less than or equal to 300"),
    ],
)
def test_invalid_oidc_settings_fail_at_start(given: dict[str, Any], says: str) -> None:
    with pytest.raises(ValidationError, match=says):
        Settings(**given)
    # The same from the environment, as a deployment sets it.
    env = {f"RLRUN_{k.upper()}": str(v) for k, v in given.items()}
    with pytest.MonkeyPatch.context() as mp:
        for name, value in env.items():
            mp.setenv(name, value)
        with pytest.raises(ValidationError, match=says):
            Settings()


def test_rlrun_serve_names_the_setting_and_does_not_start() -> None:
    env = {"RLRUN_OIDC_ISSUER": "https://idp.example.org", "RLRUN_OIDC_AUDIENCE": ""}
    refused = CliRunner().invoke(cli, ["serve", "--port", "0"], env=env)
    assert refused.exit_code == 2
    assert "RLRUN_OIDC_AUDIENCE go together" in refused.output
    assert "Traceback" not in refused.output
