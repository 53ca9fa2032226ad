"""What the dashboard reads before it draws: ``GET /ui/config`` and the recipes' schemas."""

from __future__ import annotations

from fastapi.testclient import TestClient

from service.app import create_app
from service.store.status import TERMINAL, RunStatus
from tests.conftest import make_settings


def test_the_page_learns_auth_and_the_service_words_without_a_token(api: TestClient) -> None:
    config = api.get("/ui/config").json()
    assert config["auth"] is False
    assert config["statuses"] == [s.value for s in RunStatus]
    assert set(config["terminal"]) == set(TERMINAL)
    assert config["reward_key"] == "critic/score/mean"
    assert config["baseline_keys"]["reward"] == config["reward_key"]


def test_with_auth_on_the_page_is_told_so_before_signing_in(db_url: str) -> None:
    settings = make_settings(db_url, "http://127.0.0.1:9", run_loops=False, auth="on")
    with TestClient(create_app(settings)) as api:
        assert api.get("/runs").status_code == 401
        assert api.get("/ui/config").json()["auth"] is True


def test_each_recipe_carries_the_json_schema_its_form_is_drawn_from(api: TestClient) -> None:
    recipes = {r["name"]: r for r in api.get("/recipes").json()}
    schema = recipes["test-script"]["spec_schema"]
    assert schema["properties"]["seconds"]["type"] == "number"
    assert schema["properties"]["seconds"]["default"] == 0.0
    verl = recipes["verl-fully-async"]["spec_schema"]
    assert "$defs" in verl and "resources" in verl["properties"]
