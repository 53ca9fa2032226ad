"""verl's fully async GRPO trainer as a recipe (spec, preset, command, Hydra check, rules)."""

from service.recipes.verl.recipe import VerlFullyAsyncRecipe

__all__ = ["VerlFullyAsyncRecipe"]
