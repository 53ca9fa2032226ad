"""The settings: sections that compose one flat ``Settings``, read from ``RLRUN_*``; every list
read one way; every credential a secret no dump, log or answer shows."""

from __future__ import annotations

import json
import logging
import re
from typing import Any, get_args, get_origin

import pytest
from fastapi.testclient import TestClient
from pydantic import SecretStr, ValidationError
from pydantic_settings import NoDecode
from sqlalchemy.engine import make_url

from service.app import create_app
from service.settings import Settings, sections


def test_every_setting_is_in_exactly_one_section_with_a_description() -> None:
    seen: dict[str, str] = {}
    for section in sections():
        assert section.__doc__, section.__name__
        for name, field in section.model_fields.items():
            assert name not in seen, f"{name} in {seen.get(name)} and {section.__name__}"
            seen[name] = section.__name__
            assert field.description, f"{section.__name__}.{name}: a docstring under the field"
    assert sorted(seen) == sorted(Settings.model_fields), "a setting outside every section"


def test_env_names_stay_flat(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLRUN_RAY_ADDRESS", "http://ray.example:8265")
    monkeypatch.setenv("RLRUN_DB_POOL_SIZE", "7")
    monkeypatch.setenv("RLRUN_WEBHOOK_RETRY_S", "2.5")
    settings = Settings()
    assert settings.ray_address == "http://ray.example:8265"
    assert (settings.db_pool_size, settings.webhook_retry_s) == (7, 2.5)
    assert not settings.uses_local_ray


LISTS = sorted(
    name for name, field in Settings.model_fields.items() if get_origin(field.annotation) is list
)
SAMPLES: dict[str, list[Any]] = {
    "data_roots": ["/shared", "hdfs://nn/data"],
    "oidc_algorithms": ["RS256", "EdDSA"],
    "local_npus": [8, 8],
    "preemptible_priorities": ["low", "normal"],
}


def test_every_list_setting_is_read_one_way() -> None:
    assert len(LISTS) >= 13
    for name in LISTS:
        assert NoDecode in Settings.model_fields[name].metadata, f"{name}: use Names or Counts"


@pytest.mark.parametrize("name", LISTS)
def test_a_list_setting_is_a_json_list_or_items_between_commas(
    monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    want = SAMPLES.get(name, ["a", "b:c"])
    env = f"RLRUN_{name.upper()}"
    for given in (json.dumps(want), ", ".join(map(str, want)), ",".join(map(str, want)) + ","):
        monkeypatch.setenv(env, given)
        assert getattr(Settings(), name) == want, given
    monkeypatch.setenv(env, '["a", ')
    with pytest.raises(ValidationError, match=name):
        Settings()


def test_a_json_item_may_hold_a_comma_and_a_bracket_alone_is_no_json(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("RLRUN_PREFLIGHT_PACKAGES", '["torch>=2.1,<3", "vllm"]')
    assert Settings().preflight_packages == ["torch>=2.1,<3", "vllm"]
    monkeypatch.setenv("RLRUN_WEBHOOK_ALLOW", "")
    assert Settings().webhook_allow == []
    monkeypatch.setenv("RLRUN_ALLOWED_HOSTS", "[::1], localhost")
    assert Settings().allowed_hosts == ["[::1]", "localhost"]


@pytest.mark.parametrize("given", ["", "8,x", "-1", "[8, 8.5]"])
def test_local_npus_are_counts_per_node(monkeypatch: pytest.MonkeyPatch, given: str) -> None:
    monkeypatch.setenv("RLRUN_LOCAL_NPUS", given)
    with pytest.raises(ValidationError, match="local_npus"):
        Settings()


DB_PASSWORD = "pw-never-shown-1f3a"
RAY_TOKEN = "tok-never-shown-9c2e"
# A setting named like a credential must be a SecretStr (``secrets_dir`` is a directory).
CREDENTIAL = re.compile(r"(^|_)(token|password|passwd|secret|credentials?|api_key)(_|$)")


def test_every_credential_is_a_secret() -> None:
    named = {name for name in Settings.model_fields if CREDENTIAL.search(name)}
    assert named >= {"ray_token"}
    for name in named | {"database_url"}:
        annotation = Settings.model_fields[name].annotation
        assert SecretStr in (annotation, *get_args(annotation)), name


def test_no_dump_shows_a_credential(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLRUN_RAY_TOKEN", RAY_TOKEN)
    monkeypatch.setenv("RLRUN_DATABASE_URL", f"postgresql+psycopg://u:{DB_PASSWORD}@db/rlrun")
    settings = Settings()
    dumps = [repr(settings), str(settings), settings.model_dump_json(), f"{settings.model_dump()}"]
    for text in dumps:
        assert RAY_TOKEN not in text and DB_PASSWORD not in text, text
    assert settings.ray_token is not None and settings.ray_token.get_secret_value() == RAY_TOKEN
    assert DB_PASSWORD in settings.database_url.get_secret_value()


@pytest.mark.postgres
def test_readyz_for_an_admin_and_the_logs_show_no_credential(
    pg_database: str, caplog: pytest.LogCaptureFixture
) -> None:
    # Trust authentication: the server takes the URL whatever its password.
    url = make_url(pg_database).set(password=DB_PASSWORD).render_as_string(hide_password=False)
    settings = Settings(
        database_url=url, ray_address="http://127.0.0.1:9", ray_token=RAY_TOKEN, run_loops=False
    )
    caplog.set_level(logging.DEBUG)
    with TestClient(create_app(settings)) as client:
        answer = client.get("/readyz")
        shown = repr(client.app.state.services.settings)  # type: ignore[attr-defined]
    checks = answer.json()["checks"]
    assert checks["database"] == {"ok": True}
    assert checks["ray"]["ok"] is False and checks["ray"]["error"], "an admin sees the error"
    for text in (answer.text, shown, caplog.text):
        assert RAY_TOKEN not in text and DB_PASSWORD not in text


def test_a_preemption_policy_naming_an_unknown_priority_stops_the_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("RLRUN_PREEMPTIBLE_PRIORITIES", "low,urgent")
    with pytest.raises(ValidationError, match="names 'urgent': the priorities are low, normal"):
        Settings()
