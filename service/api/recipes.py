"""``GET /recipes``: the recipes this service runs and their presets (what a submit form offers)."""

from __future__ import annotations

from fastapi import APIRouter
from pydantic import BaseModel

from service.deps import ServicesDep

router = APIRouter(tags=["runs"])


class RecipeOut(BaseModel):
    name: str
    presets: list[str]


@router.get("/recipes", response_model=list[RecipeOut])
def list_recipes(services: ServicesDep) -> list[RecipeOut]:
    registry = services.registry
    return [
        RecipeOut(name=name, presets=list(getattr(registry.get(name), "presets", ())))
        for name in registry.names()
    ]
