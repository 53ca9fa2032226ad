"""The settings: sections that compose one flat ``Settings``, read from ``RLRUN_*``."""

from __future__ import annotations

import pytest

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
