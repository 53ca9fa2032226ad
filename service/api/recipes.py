"""``GET /recipes``: the recipes this service runs, their presets and the JSON Schema of each
one's run spec (what a submit form offers and is generated from)."""

from __future__ import annotations

from fastapi import APIRouter

from service.api.auth import Viewer
from service.api.deps import ServicesDep
from service.wire.cluster import RecipeOut

router = APIRouter(tags=["runs"])


@router.get("/recipes", response_model=list[RecipeOut])
def list_recipes(services: ServicesDep, principal: Viewer) -> list[RecipeOut]:
    registry = services.registry
    return [
        RecipeOut(
            name=name,
            presets=list(getattr(registry.get(name), "presets", ())),
            spec_schema=registry.get(name).spec_model.model_json_schema(),
        )
        for name in registry.names()
    ]
