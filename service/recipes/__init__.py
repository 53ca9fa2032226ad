"""Recipes turn a validated run spec into a job launch; see ``base`` and ``registry``."""

from service.recipes.base import Group, Launch, LaunchContext, Recipe, ResourceShape, RunSpec
from service.recipes.registry import RecipeRegistry, default_registry

__all__ = [
    "Group",
    "Launch",
    "LaunchContext",
    "Recipe",
    "RecipeRegistry",
    "ResourceShape",
    "RunSpec",
    "default_registry",
]
