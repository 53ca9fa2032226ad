"""Test-only recipes: small scripts that exercise the success, failure, slow and stop paths."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from service.recipes.base import Launch, LaunchContext, RunSpec
from service.recipes.registry import RecipeRegistry
from service.recipes.verl.recipe import VerlFullyAsyncRecipe
from service.scheduling.shape import Group, ResourceShape

# Runs on the cluster as `python3 -c SCRIPT name seconds exit_code message`.
_ARGS = """
import json, sys, time
name, seconds, code, message = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
"""
_RUN = """
deadline = time.time() + seconds
while time.time() < deadline:
    time.sleep(0.2)
if message:
    # Specs may not carry control characters: "<ESC>" stands for the escape character.
    print(message.replace("<ESC>", chr(27)), flush=True)
sys.exit(code)
"""
SCRIPT = _ARGS + 'print("script run", name, flush=True)' + _RUN
# With `show_env`: the job prints its whole environment as one line, `ENV {...}`.
_ENV = """
import os
print("ENV", json.dumps(dict(os.environ)), flush=True)
"""

# With `groups`: the job also holds one placement group with a bundle per group until it ends
# (`python3 -c PG_SCRIPT name seconds exit_code message bundles_json`).
PG_SCRIPT = (
    _ARGS
    + """
import ray
from ray.util.placement_group import placement_group
bundles = json.loads(sys.argv[5])
ray.init()
pg = placement_group(bundles, strategy="PACK")
ray.get(pg.ready())
print("script run", name, "placed", len(bundles), "groups", flush=True)
"""
    + _RUN
)

# With `stop_job_url`: the job first stops another job through Ray's Jobs REST API, as any code
# on the cluster can (`python3 -c STOP_SCRIPT name seconds exit_code message url`): with token
# auth, by reading the token file its node was started with (same Unix user).
STOP_SCRIPT = (
    _ARGS
    + """
import os, urllib.request
path = os.environ.get("RAY_AUTH_TOKEN_PATH")
headers = {"Authorization": "Bearer " + open(path).read().strip()} if path else {}
stop = urllib.request.Request(sys.argv[5], method="POST", headers=headers)
with urllib.request.urlopen(stop, timeout=30) as r:
    print("script run", name, "stopped another job:", r.status, r.read().decode(), flush=True)
"""
    + _RUN
)

# With `actor_npus`: the job asks Ray for one actor holding that many NPUs and waits, placed or
# not (`python3 -c ACTOR_SCRIPT name seconds exit_code message npus`): a shape the service never
# saw, as a verl rollout server's is.
ACTOR_SCRIPT = (
    _ARGS
    + """
import ray
ray.init()
@ray.remote(num_cpus=0)
class Waiting:
    def ping(self):
        return 1
actor = Waiting.options(resources={"NPU": float(sys.argv[5])}).remote()
print("script run", name, "asked for an actor", flush=True)
"""
    + _RUN
)

# With `actor_dies`: the job's one actor exits at once; the job says nothing of it, waits and
# exits with its code (`python3 -c DYING_SCRIPT name seconds exit_code message`): only Ray's
# state API knows what died.
DYING_SCRIPT = (
    _ARGS
    + """
import os, ray
ray.init()
@ray.remote(num_cpus=0, max_restarts=0)
class Dying:
    def exit(self):
        os._exit(1)
actor = Dying.remote()
try:
    ray.get(actor.exit.remote())
except Exception:
    pass
print("script run", name, "carries on", flush=True)
"""
    + _RUN
)


class GroupSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    role: str = Field(default="job", pattern=r"^[a-z][a-z0-9_-]{0,31}$")
    accelerators: int = Field(ge=1, le=64)
    cpus: float = Field(default=1.0, ge=0, le=64)
    count: int = Field(default=1, ge=1, le=16)


class ScriptSpec(RunSpec):
    recipe: Literal["test-script"] = "test-script"
    seconds: float = Field(default=0.0, ge=0, le=3600)
    exit_code: int = Field(default=0, ge=0, le=255)
    message: str = ""
    npus: int = Field(default=0, ge=0, le=64)
    groups: list[GroupSpec] = Field(default_factory=list, max_length=8)
    # `<dashboard>/api/jobs/<id>/stop`: a job that stops another one behind the service's back.
    stop_job_url: str = ""
    show_env: bool = False
    actor_npus: int = Field(default=0, ge=0, le=64)
    actor_dies: bool = False


def script_launch(
    script: str, *args: str, cpus: float = 0.1, groups: tuple[Group, ...] = (), **more: Any
) -> Launch:
    """``python3 -c script args`` as a test job: on NPUs (``groups``), ``cpus`` for its driver,
    stopped within 2 s; ``more``: the rest of its ``Launch``."""
    return Launch(
        argv=["python3", "-c", script, *args],
        runtime_env={"env_vars": {"RAY_JOB_STOP_WAIT_TIME_S": "2"}},
        shape=ResourceShape(accelerator="NPU", groups=groups, driver_cpus=cpus),
        entrypoint_num_cpus=cpus,
        **more,
    )


class ScriptRecipe:
    """A job that prints, sleeps, exits with a chosen code and can hold NPUs while it runs."""

    name: ClassVar[str] = "test-script"
    spec_model: ClassVar[type[RunSpec]] = ScriptSpec

    def build(self, spec: Any, ctx: LaunchContext) -> Launch:
        assert isinstance(spec, ScriptSpec)
        name = spec.name or ctx.run_id
        args = [name, str(spec.seconds), str(spec.exit_code), spec.message]
        if spec.groups:
            return self._with_env(spec, self._with_groups(spec, args))
        script, more = SCRIPT, []
        if spec.stop_job_url:
            script, more = STOP_SCRIPT, [spec.stop_job_url]
        if spec.actor_dies:
            script, more = DYING_SCRIPT, []
        if spec.actor_npus:
            script, more = ACTOR_SCRIPT, [str(spec.actor_npus)]
        groups = (Group("job", spec.npus, 0.0, size_field="npus"),) if spec.npus else ()
        launch = script_launch(
            script,
            *args,
            *more,
            groups=groups,
            entrypoint_resources={"NPU": float(spec.npus)} if spec.npus else {},
        )
        return self._with_env(spec, launch)

    @staticmethod
    def _with_env(spec: ScriptSpec, launch: Launch) -> Launch:
        if not spec.show_env:
            return launch
        argv = list(launch.argv)
        argv[2] = argv[2].replace(_RUN, _ENV + _RUN)
        return replace(launch, argv=argv)

    @staticmethod
    def _with_groups(spec: ScriptSpec, args: list[str]) -> Launch:
        groups = tuple(
            Group(
                g.role,
                g.accelerators,
                g.cpus,
                size_field=f"groups[{i}].accelerators",
                count_field=f"groups[{i}].count",
            )
            for i, g in enumerate(spec.groups)
            for _ in range(g.count)
        )
        bundles = [
            {k: v for k, v in (("NPU", g.accelerators), ("CPU", g.cpus)) if v} for g in groups
        ]
        return script_launch(PG_SCRIPT, *args, json.dumps(bundles), groups=groups)


# `python3 -c METRICS_SCRIPT seconds every_s steps`: a verl-shaped metric line every ``every_s``
# (at most ``steps`` of them, when not 0), then exit 0.
METRICS_SCRIPT = """
import sys, time
seconds, every, steps = float(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
step, deadline = 0, time.time() + seconds
while time.time() < deadline and not (steps and step >= steps):
    step += 1
    print(
        f"step:{step} - training/global_step:{step} - fully_async/count/current_param_version:"
        f"{step} - critic/score/mean:{1 - 1 / (step + 1):.6f} - actor/pg_loss:{0.1 / step:.6f}",
        flush=True,
    )
    time.sleep(every)
"""


class MetricsSpec(RunSpec):
    recipe: Literal["test-metrics"] = "test-metrics"
    seconds: float = Field(default=60.0, ge=0, le=3600)
    every_s: float = Field(default=1.0, gt=0, le=60)
    steps: int = Field(default=0, ge=0, description="stop after this many lines (0: no limit)")
    total_steps: int | None = Field(default=None, ge=1, description="the steps it plans")


class MetricsRecipe:
    """A job that trains in name only: a metric line every ``every_s`` for ``seconds``."""

    name: ClassVar[str] = "test-metrics"
    spec_model: ClassVar[type[RunSpec]] = MetricsSpec

    def build(self, spec: Any, ctx: LaunchContext) -> Launch:
        assert isinstance(spec, MetricsSpec)
        return script_launch(
            METRICS_SCRIPT,
            str(spec.seconds),
            str(spec.every_s),
            str(spec.steps),
            cpus=0.0,
            total_steps=spec.total_steps,
        )


def register(registry: RecipeRegistry) -> None:
    registry.register(ScriptRecipe())
    registry.register(MetricsRecipe())


class SmallClusterVerlRecipe(VerlFullyAsyncRecipe):
    """The real verl recipe (spec, checks, launcher and its plan, argv) with the CPUs its shape
    holds scaled to nothing, so a verl run is admitted on the test cluster's 8-CPU virtual nodes
    (verl's driver actors alone want 23 CPUs); what it tests is the launch, not admission."""

    def build(self, spec: Any, ctx: LaunchContext) -> Launch:
        launch = super().build(spec, ctx)
        groups = tuple(replace(g, cpus=0.0) for g in launch.shape.groups)
        return replace(launch, shape=replace(launch.shape, groups=groups, driver_cpus=0.0))


def register_small_verl(registry: RecipeRegistry) -> None:
    register(registry)
    verl = registry.get(VerlFullyAsyncRecipe.name)
    assert isinstance(verl, VerlFullyAsyncRecipe)
    registry.register(SmallClusterVerlRecipe(verl.settings))


def retried_tiny_grpo(name: str, versions: int, on: str) -> dict[str, Any]:
    """A tiny-grpo spec of ``versions`` parameter versions (two trainer steps of 8 rollout steps
    each), a checkpoint every 2 trainer steps, and one more attempt at once after ``on``: the
    run a killed trainer or a lost node interrupts."""
    return {
        "recipe": "tiny-grpo",
        "name": name,
        "total_rollout_steps": 16 * versions,
        "gen_seconds": 0.3,
        "save_every": 2,
        "retry": {"max_attempts": 2, "on": [on], "backoff_s": 0},
    }
