"""Where a run's step time goes (``metrics.steptime``) and, where another split of its
accelerators would help, the spec that makes it: the run's own spec with ``resources`` moved,
checked by the dry-run planner (``accept.plan_run``: verl's rules, the cluster's shape, the
queue) before it is offered, ready to ``POST /runs``."""

from __future__ import annotations

import copy
from typing import Any

from service.errors import ProblemError
from service.metrics import store
from service.metrics.rl_signals import pools
from service.metrics.steptime import KEYS, analyse, as_doc
from service.operations.accept import plan_run
from service.operations.parts import Parts
from service.principal import Principal
from service.recipes.verl.preset import PRESETS, deep_merge
from service.recipes.verl.recipe import VerlFullyAsyncRecipe
from service.store.runs import load_run
from service.team_secrets import masked_spec

# Points per key the breakdown reads (the chart's resolution on a longer run).
MAX_POINTS = 2000
# Splits tried with the planner, nearest the even one first.
TRIED = 3


def step_time(parts: Parts, principal: Principal, run_id: str) -> dict[str, Any]:
    """``wire.metrics.StepTimeOut`` of a run the caller sees (checked by the route)."""
    with parts.db.read() as session:
        run = load_run(session, run_id)
        found = store.series(session, run_id, list(KEYS), MAX_POINTS)
        spec, held, run_recipe = dict(run.spec), pools(run), run.recipe
    series = {k: [(p.step, p.value) for p in points] for k, points in found.items()}
    analysis = analyse(series, held)
    doc = {"run_id": run_id, "trainer_accelerators": held[0], "rollout_accelerators": held[1]}
    change = None
    if analysis.to_rollout and run_recipe == VerlFullyAsyncRecipe.name:
        change = spec_change(parts, principal, spec, analysis.to_rollout)
    return doc | as_doc(analysis) | {"change": change}


def splits(resources: dict[str, Any], to_rollout: int) -> list[dict[str, Any]]:
    """``resources`` with accelerators moved between the groups, node counts kept: the splits in
    the direction asked, nearest ``to_rollout`` first."""
    g_t, n_t = int(resources.get("n_gpus_training", 8)), int(resources.get("n_nodes_train", 1))
    g_r, n_r = int(resources.get("n_gpus_rollout", 8)), int(resources.get("n_nodes_rollout", 1))
    total, trainer = g_t * n_t + g_r * n_r, g_t * n_t
    out = []
    for g in range(1, 129):
        rest = total - g * n_t
        if rest < n_r or rest % n_r or rest // n_r > 128 or g == g_t:
            continue
        moved = trainer - g * n_t
        if (moved > 0) == (to_rollout > 0):
            out.append((abs(moved - to_rollout), g, rest // n_r))
    return [
        dict(resources) | {"n_gpus_training": g, "n_gpus_rollout": r} for _, g, r in sorted(out)
    ]


def spec_change(
    parts: Parts, principal: Principal, spec: dict[str, Any], to_rollout: int
) -> dict[str, Any] | None:
    """The first split the planner accepts (verl's rules hold, the shape can fit the cluster),
    with its plan; None when none of the nearest does."""
    resources = effective_resources(parts, spec)
    refused: list[str] = []
    for candidate in splits(resources, to_rollout)[:TRIED]:
        given = {k: candidate[k] for k in _FIELDS}
        body = copy.deepcopy(spec) | {"resources": (spec.get("resources") or {}) | given}
        body.pop("team", None)  # the caller's, as a submit would make it
        try:
            planned = plan_run(parts, principal, body)
        except ProblemError as exc:
            refused.append(f"{_split(candidate)}: {exc}")
            continue
        plan = planned.get("plan", {})
        if plan.get("feasible_ever") is False:
            refused.append(f"{_split(candidate)}: {'; '.join(plan.get('reasons', []))}")
            continue
        kind = str(resources.get("accelerator", "npu")).upper()
        moved = _total(resources, "trainer") - _total(candidate, "trainer")
        src, dst = ("trainer", "rollout") if moved > 0 else ("rollout", "trainer")
        return {
            "summary": f"move {abs(moved)} {kind}s from the {src} group to the {dst} group",
            "accelerators": abs(moved),
            "from": src,
            "to": dst,
            "resources": {"before": resources, "after": candidate},
            "spec": masked_spec(body),
            "plan": {
                "feasible_now": plan.get("feasible_now"),
                "feasible_ever": plan.get("feasible_ever"),
                "reasons": plan.get("reasons", []),
            },
            "refused": refused,
        }
    return None


_FIELDS = ("n_gpus_training", "n_nodes_train", "n_gpus_rollout", "n_nodes_rollout")


def effective_resources(parts: Parts, spec: dict[str, Any]) -> dict[str, Any]:
    """The spec's ``resources`` on top of its preset's, as the launch was built from."""
    preset = PRESETS.get(str(spec.get("preset")))
    base = dict(preset(parts.settings).get("resources") or {}) if preset else {}
    return deep_merge(base, dict(spec.get("resources") or {}))


def _total(resources: dict[str, Any], group: str) -> int:
    if group == "trainer":
        return int(resources.get("n_gpus_training", 8)) * int(resources.get("n_nodes_train", 1))
    return int(resources.get("n_gpus_rollout", 8)) * int(resources.get("n_nodes_rollout", 1))


def _split(resources: dict[str, Any]) -> str:
    return f"{_total(resources, 'trainer')} trainer + {_total(resources, 'rollout')} rollout"
