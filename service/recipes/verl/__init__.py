"""verl's fully async GRPO trainer as a recipe (spec, preset, command, Hydra check, rules)."""
