"""A test-only recipe whose job does what a launcher does with a secrets grant (``jobs.grant``),
then reports, as SHA-256 digests only, what its driver, an actor and a task see of one variable,
and whether the value is anywhere in the GCS job table or in the store the workers read."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field

from service.recipes.base import Launch, LaunchContext, RunSpec
from service.recipes.registry import RecipeRegistry
from tests.recipes import script_launch

SCRIPT = """
import hashlib, os, sys
import ray
from jobs import grant

var = sys.argv[1]
values, submission_id = grant.redeem()
ray.init()
grant.share(values, submission_id)


def digest(value):
    return hashlib.sha256((value or "").encode()).hexdigest()[:16]


@ray.remote(num_cpus=0)
class Probe:
    def seen(self, var):
        return digest(os.environ.get(var))


@ray.remote(num_cpus=0)
def seen(var):
    return digest(os.environ.get(var))


print("probe driver", digest(os.environ.get(var)), flush=True)
print("probe actor", ray.get(Probe.remote().seen.remote(var)), flush=True)
print("probe task", ray.get(seen.remote(var)), flush=True)
value = os.environ.get(var, "").encode()
from ray._private.state import state
table = state._connect_and_get_accessor().get_job_table(
    skip_submission_job_info_field=False, skip_is_running_tasks_field=True
)
print("probe job table holds it", bool(value) and any(value in row for row in table), flush=True)
from ray.experimental.internal_kv import _internal_kv_get
key = grant.holder_name(os.environ[grant.GRANT_ENV])
stored = _internal_kv_get(key, namespace=grant.HOLDER_NAMESPACE)
print("probe store holds it", bool(value) and value in (stored or b""), flush=True)
"""


class ProbeSpec(RunSpec):
    recipe: Literal["test-secret-probe"] = "test-secret-probe"
    var: str = Field(default="WANDB_API_KEY", pattern=r"^[A-Z_]{1,64}$")


class ProbeRecipe:
    name: ClassVar[str] = "test-secret-probe"
    spec_model: ClassVar[type[RunSpec]] = ProbeSpec

    def build(self, spec: Any, ctx: LaunchContext) -> Launch:
        assert isinstance(spec, ProbeSpec)
        return script_launch(SCRIPT, spec.var)


def register(registry: RecipeRegistry) -> None:
    registry.register(ProbeRecipe())
