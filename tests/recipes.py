"""Test-only recipes: small scripts that exercise the success, failure, slow and stop paths."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field

from service.recipes.base import Group, Launch, LaunchContext, ResourceShape, RunSpec
from service.recipes.registry import RecipeRegistry

# Runs on the cluster as `python3 -c SCRIPT name seconds exit_code message`.
SCRIPT = """
import sys, time
name, seconds, code, message = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
print("script run", name, flush=True)
deadline = time.time() + seconds
while time.time() < deadline:
    time.sleep(0.2)
if message:
    print(message, flush=True)
sys.exit(code)
"""


class ScriptSpec(RunSpec):
    recipe: Literal["test-script"] = "test-script"
    seconds: float = Field(default=0.0, ge=0, le=3600)
    exit_code: int = Field(default=0, ge=0, le=255)
    message: str = ""
    npus: int = Field(default=0, ge=0, le=64)


class ScriptRecipe:
    """A job that prints, sleeps, exits with a chosen code and can hold NPUs while it runs."""

    name: ClassVar[str] = "test-script"
    spec_model: ClassVar[type[RunSpec]] = ScriptSpec

    def build(self, spec: Any, ctx: LaunchContext) -> Launch:
        assert isinstance(spec, ScriptSpec)
        name = spec.name or ctx.run_id
        argv = ["python3", "-c", SCRIPT, name, str(spec.seconds), str(spec.exit_code), spec.message]
        groups = (Group("job", spec.npus, 0.0),) if spec.npus else ()
        return Launch(
            argv=argv,
            runtime_env={"env_vars": {"RAY_JOB_STOP_WAIT_TIME_S": "2"}},
            shape=ResourceShape(accelerator="NPU", groups=groups, driver_cpus=0.1),
            entrypoint_num_cpus=0.1,
            entrypoint_resources={"NPU": float(spec.npus)} if spec.npus else {},
        )


def register(registry: RecipeRegistry) -> None:
    registry.register(ScriptRecipe())
