"""``rlrun why-slow ID``: where a run's step time goes and what to change (the answer of
``GET /runs/{id}/step-time``)."""

from __future__ import annotations

import json
import sys

from service.cli.common import clean, connect, emit_json, say
from service.cli.options import Output, OutputOpt, ServerOpt, TokenOpt
from service.wire.metrics import StepTimeOut


def why_slow(
    run_id: str,
    server: ServerOpt = None,
    token: TokenOpt = None,
    output: OutputOpt = Output.table,
) -> None:
    """Where the run's step time goes (verl's own timers), the verdict (rollout-bound,
    trainer-bound, sync-bound, balanced) with its figures, the weight sync's trend, and the spec
    change (checked by the planner) where another split of accelerators would help."""
    with connect(server, token) as client:
        answer = client.step_time(run_id)
    if output == Output.json:
        emit_json(answer)
        return
    print_step_time(answer)


def _pct(value: float | None) -> str:
    return "not logged" if value is None else f"{value:.0%}"


def print_step_time(a: StepTimeOut) -> None:
    say(f"{a.verdict}: {clean(a.summary)}", style="bold")
    f = a.figures
    if a.steps:
        step_s = f.get("step_seconds")
        say(
            f"over {int(f.get('steps') or 0)} steps ({step_s:.3g} s a step, median): "
            if step_s is not None
            else "",
            f"wait for samples {_pct(f.get('wait_share'))}, update {_pct(f.get('update_share'))}, "
            f"weight sync {_pct(f.get('sync_share'))}, other {_pct(f.get('other_share'))}",
        )
        say(
            f"idle: trainer {_pct(f.get('trainer_idle'))} ({a.sources.get('trainer_idle', '')}), "
            f"rollouts {_pct(f.get('rollout_idle'))} ({a.sources.get('rollout_idle', '')}); "
            f"verl's idle ratios: trainer {_pct(f.get('verl_trainer_idle_ratio'))}, "
            f"rollouter {_pct(f.get('verl_rollouter_idle_ratio'))}"
        )
    say(f"accelerators: {a.trainer_accelerators} trainer, {a.rollout_accelerators} rollout")
    if a.sync_trend is not None:
        t = a.sync_trend
        say(
            f"weight sync: {t.first_seconds:.3g} s at first, {t.last_seconds:.3g} s now "
            f"({t.slope_seconds_per_step:+.3g} s per step)" + (" - growing" if t.growing else ""),
            style="red" if t.growing else "",
        )
    for note in a.notes:
        say(f"note: {clean(note)}", style="yellow")
    if a.change is not None:
        c = a.change
        plan = c.plan
        fits = "fits now" if plan.feasible_now else "fits the cluster, not now"
        say(f"change: {clean(c.summary)} ({fits})", style="green")
        say("the spec, ready for rlrun submit -:")
        sys.stdout.write(json.dumps(c.spec, indent=2) + "\n")
