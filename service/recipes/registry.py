"""The recipe registry: name -> recipe, and the one place a request body becomes a spec."""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Sequence
from typing import Any

from pydantic import ValidationError

from service.errors import InvalidSpec, field_error, invalid_from_pydantic
from service.recipes import env_names, storable
from service.recipes.base import Launch, LaunchContext, Recipe, RunSpec
from service.recipes.tiny_grpo import TinyGrpoRecipe, default_checkpoint_root
from service.recipes.verl.recipe import VerlFullyAsyncRecipe
from service.settings import Settings


class RecipeRegistry:
    def __init__(self, env_allow: Sequence[str] = ()) -> None:
        self._recipes: dict[str, Recipe] = {}
        self.env_allow = tuple(env_allow)

    def register(self, recipe: Recipe) -> None:
        self._recipes[recipe.name] = recipe

    def names(self) -> list[str]:
        return sorted(self._recipes)

    def get(self, name: str) -> Recipe:
        return self._recipes[name]

    def parse(self, body: Any) -> tuple[Recipe, RunSpec]:
        """Validate a request body against its recipe's spec model (422 with field paths)."""
        if not isinstance(body, dict):
            raise InvalidSpec(
                "the run spec must be a JSON object", [field_error([], "not an object")]
            )
        storable.check(body)
        name = body.get("recipe")
        if name not in self._recipes:
            msg = f"unknown recipe {name!r}; known: {', '.join(self.names()) or 'none'}"
            raise InvalidSpec(msg, [field_error(["recipe"], msg, "unknown_recipe")])
        recipe = self._recipes[name]
        try:
            spec = recipe.spec_model.model_validate(body)
        except ValidationError as exc:
            raise invalid_from_pydantic(exc) from exc
        return recipe, spec

    def build(self, body: Any, ctx: LaunchContext) -> tuple[RunSpec, Launch]:
        recipe, spec = self.parse(body)
        launch = recipe.build(spec, ctx)
        # Whatever composed them (a spec, a preset, the recipe): no value Ray would expand.
        expanded = [
            field_error(["runtime_env", "env_vars", name], why, "forbidden_env")
            for name, value in launch.runtime_env.get("env_vars", {}).items()
            if (why := env_names.value_refusal(value))
        ]
        if expanded:
            raise InvalidSpec(expanded[0]["msg"], expanded)
        if not spec.secrets:
            return spec, launch
        env = launch.runtime_env.get("env_vars", {})
        errors = []
        for var in spec.secrets:
            why = env_names.refusal(var, self.env_allow)
            if why is None and var in env:
                why = f"{var} is also set in the job's environment"
            if why:
                errors.append(field_error(["secrets", var], why))
        if errors:
            raise InvalidSpec(errors[0]["msg"], errors)
        return spec, dataclasses.replace(launch, secrets=dict(spec.secrets))


def default_registry(
    plugins: Sequence[str] = (), settings: Settings | None = None
) -> RecipeRegistry:
    """The recipes rlrun ships, plus any ``module:function`` plugins that register more."""
    registry = RecipeRegistry(settings.env_allow if settings else ())
    registry.register(VerlFullyAsyncRecipe(settings or Settings()))
    root = ""
    if settings is not None:
        root = settings.tiny_grpo_checkpoint_root or default_checkpoint_root(settings.instance_name)
    registry.register(TinyGrpoRecipe(root))
    for entry in plugins:
        module, _, func = entry.partition(":")
        getattr(importlib.import_module(module), func or "register")(registry)
    return registry
