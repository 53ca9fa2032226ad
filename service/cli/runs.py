"""A run's life from the command line: submit (with a dry run), list, status (``--follow``),
cancel and retry."""

from __future__ import annotations

import contextlib
import json
import sys
from datetime import datetime
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml
from rich.progress import BarColumn, Progress, TaskID, TextColumn
from rich.text import Text

from service.cli.common import (
    EXIT_RUN_FAILED,
    STATUS_STYLE,
    clean,
    connect,
    console,
    emit_json,
    errors,
    number,
    say,
    usage_error,
)
from service.cli.options import FollowOpt, Output, OutputOpt, ServerOpt, TokenOpt
from service.cli_tables import Column, print_table
from service.client import Client, Event, Unreachable
from service.clock import utcnow
from service.metrics.keys import REWARD_KEY, STEP_KEY
from service.wire.runs import RunOut, RunSummary


def load_spec(path: str, preset: str | None, sets: list[str]) -> dict[str, Any]:
    """A spec file (JSON or YAML; ``-`` for standard input) with ``--preset`` and each
    ``--set dotted.key=value`` applied (values read as YAML: numbers, booleans, lists)."""
    where = "standard input" if path == "-" else path
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
        spec = yaml.safe_load(text) if text.strip() else {}
    except FileNotFoundError:
        usage_error(f"{where}: no such file")
    except IsADirectoryError:
        usage_error(f"{where}: a directory, not a spec file")
    except UnicodeDecodeError:
        usage_error(f"{where}: not UTF-8 text")
    except OSError as exc:
        usage_error(f"{where}: {exc.strerror or exc}")
    except yaml.YAMLError as exc:
        usage_error(f"{where}: not valid JSON or YAML: {yaml_problem(exc)}")
    if not isinstance(spec, dict):
        usage_error(f"{where}: the spec must be a mapping of fields, not {type(spec).__name__}")
    if preset:
        spec["preset"] = preset
    for item in sets:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            usage_error(f"--set {item!r}: not key=value")
        *parents, leaf = key.split(".")
        node = spec
        for part in parents:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                usage_error(f"--set {key}: {part} is not a mapping")
            node = child
        try:
            node[leaf] = yaml.safe_load(raw) if raw else ""
        except yaml.YAMLError as exc:
            usage_error(f"--set {key}: not a YAML value: {yaml_problem(exc)}")
    return spec


def yaml_problem(exc: yaml.YAMLError) -> str:
    """A parser error in one line: what is wrong and where (1-based line and column)."""
    if isinstance(exc, yaml.MarkedYAMLError):
        mark = exc.problem_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        return f"{exc.problem or exc.context or 'cannot parse'}{where}"
    return " ".join(str(exc).split())


def submit(
    spec: Annotated[str, typer.Argument(help="Run spec file (.json or .yaml), - for stdin")],
    preset: Annotated[str | None, typer.Option(help="Start from this preset")] = None,
    set_: Annotated[
        list[str] | None,
        typer.Option("--set", help="Set a field, e.g. --set resources.n_gpus_training=8"),
    ] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Show the plan; store nothing")] = (
        False
    ),
    follow: FollowOpt = False,
    idempotency_key: Annotated[
        str | None, typer.Option(help="Submitting again with the same key returns the same run")
    ] = None,
    server: ServerOpt = None,
    token: TokenOpt = None,
    output: OutputOpt = Output.table,
) -> None:
    """Submit a run (or only plan it with --dry-run); print its id alone."""
    body = load_spec(spec, preset, set_ or [])
    with connect(server, token) as client:
        if dry_run:
            plan = client.dry_run(body)
            emit_json(plan) if output == Output.json else print_plan(plan)
            return
        run = client.create_run(body, idempotency_key)
        if output == Output.json and not follow:
            emit_json(run)
            return
        # The id alone on standard output: `id=$(rlrun submit spec.yaml)`.
        sys.stdout.write(run.id + "\n")
        sys.stdout.flush()
        say(run.status, style="dim", to=errors)
        if follow:
            raise typer.Exit(follow_run(client, run, output))


def print_plan(dry: dict[str, Any]) -> None:
    plan = dry.get("plan", {})
    feasible = (
        "fits now"
        if plan.get("feasible_now")
        else "waits"
        if plan.get("feasible_ever")
        else "never fits"
    )
    say(f"plan: {feasible}; queue position {plan.get('queue_position')}")
    for slot in plan.get("placement") or []:
        say(
            f"  {slot['role']} on node {slot['node']}:"
            f" {slot['accelerators']} accelerators, {slot['cpus']:g} CPUs"
        )
    for reason in plan.get("reasons") or []:
        say(f"  reason: {reason}")
    for warning in dry.get("warnings") or []:
        say(f"  warning: {warning}", style="yellow")
    say("command:", " ".join(dry.get("command") or []))


def list_runs(
    status: Annotated[list[str] | None, typer.Option(help="Only runs in this status")] = None,
    team: Annotated[str | None, typer.Option(help="Only this team's runs")] = None,
    limit: Annotated[int, typer.Option(help="How many runs")] = 20,
    cursor: Annotated[str | None, typer.Option(help="Continue after this page")] = None,
    server: ServerOpt = None,
    token: TokenOpt = None,
    output: OutputOpt = Output.table,
) -> None:
    """List runs, newest first (full ids, ready to paste into other commands)."""
    with connect(server, token) as client:
        page = client.list_runs(status or (), team, limit, cursor, baseline=True)
    if output == Output.json:
        emit_json(page)
        return
    now = utcnow()
    rows = [
        [
            Text(r.id),
            Text(clean(r.name)),
            Text(clean(r.team)),
            Text(clean(r.recipe)),
            Text(r.status, style=STATUS_STYLE.get(r.status, "")),
            Text(clean(r.health.status), style="" if r.health.status == "ok" else "red"),
            Text(step_of(r.progress.step, r.progress.total_steps)),
            Text(number(r.reward)),
            Text(versus(r)),
            Text(ago(now, r.created_at)),
        ]
        for r in page.items
    ]
    print_table(console, LIST_COLUMNS, rows)
    if page.next_cursor:
        say(f"more: --cursor {page.next_cursor}", style="dim")


# Short of width, the least telling columns go first; the id and the status stay.
LIST_COLUMNS = (
    Column("id"),
    Column("name", drop=2),
    Column("team", drop=5),
    Column("recipe", drop=7),
    Column("status"),
    Column("health", drop=6),
    Column("step", drop=3),
    Column("reward", drop=1),
    Column("vs baseline", drop=8),
    Column("age", drop=4),
)


def versus(run: RunSummary) -> str:
    """The run against its baseline at the same step: reward, response length, step time."""
    b = run.baseline
    if b is None:
        return ""
    if b.is_baseline:
        return "baseline"
    parts = [
        f"{name} {d.difference:+.3g}"
        for name, d in (("reward", b.reward), ("len", b.response_length), ("s/step", b.step_time))
        if d is not None
    ]
    return ", ".join(parts) or "no common step"


def baseline(
    run_id: str,
    unpin: Annotated[bool, typer.Option("--unpin", help="Take it off as the baseline")] = False,
    server: ServerOpt = None,
    token: TokenOpt = None,
    output: OutputOpt = Output.table,
) -> None:
    """Pin the run as the baseline of its team and recipe (the team's other runs of that recipe
    then show their difference from it at the same step in `rlrun list`); --unpin takes it off."""
    with connect(server, token) as client:
        if unpin:
            client.unpin_baseline(run_id)
            say(f"{run_id} is no longer a baseline")
            return
        pinned = client.pin_baseline(run_id)
    if output == Output.json:
        emit_json(pinned)
        return
    say(f"{run_id} is the baseline of team {pinned.team}, recipe {pinned.recipe}")


def step_of(step: int | None, total: int | None) -> str:
    if step is None:
        return ""
    return f"{step}/{total}" if total else str(step)


def ago(now: datetime, then: datetime) -> str:
    seconds = int((now - then).total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{max(seconds, 0)}s"


def status(
    run_id: str,
    follow: FollowOpt = False,
    server: ServerOpt = None,
    token: TokenOpt = None,
    output: OutputOpt = Output.table,
) -> None:
    """Show one run; with --follow, a live progress bar until it ends: a terminal status, which
    is final (a failed attempt that may be retried reads RETRYING); exit 0 if it SUCCEEDED."""
    with connect(server, token) as client:
        run = client.get_run(run_id)
        if output == Output.json and not follow:
            emit_json(run)
            return
        if output == Output.table:
            print_run(run)
        if follow:
            raise typer.Exit(follow_run(client, run, output))


def print_run(run: RunOut) -> None:
    say(run.id, run.name, style="bold")
    say(f"status {run.status}  health {run.health.status}", style=STATUS_STYLE.get(run.status))
    if run.health.reason:
        say(f"health: {run.health.reason}", style="red")
    if run.cluster:
        say(f"cluster {run.cluster}")
    if run.queue_reason:
        say(f"queued: {run.queue_reason}")
    if run.budget_wait:
        wait = run.budget_wait
        say(
            f"waits for budget: {wait.over_by_hours:,.1f} {wait.accelerator}-hours over "
            f"(used {wait.used_hours:,.1f} of {wait.budget_hours:g} in {wait.month})",
            style="yellow",
        )
    if run.over_budget_by:
        say(f"let through its team's budget by {run.over_budget_by}")
    if run.ray.message:
        say(f"ray: {run.ray.status} {run.ray.message}")
    if run.progress.step is not None:
        say(f"progress: step {step_of(run.progress.step, run.progress.total_steps)}")
    for key, value in run.metrics.latest.items():
        say(f"  {key} = {number(value)}")


def follow_run(client: Client, run: RunOut, output: Output) -> int:
    """Follow the run's events to the end; the exit code says whether it SUCCEEDED."""
    if output == Output.json:
        for event in client.events(run.id):
            sys.stdout.write(json.dumps({"event": event.kind, "id": event.id, "data": event.data}))
            sys.stdout.write("\n")
            sys.stdout.flush()
    else:
        with Progress(
            TextColumn("{task.description}", markup=False),
            BarColumn(),
            TextColumn("step {task.completed:.0f} of {task.fields[of]}", markup=False),
            TextColumn("reward {task.fields[reward]}", markup=False),
            TextColumn("{task.fields[health]}", markup=False),
            console=console,
        ) as bar:
            task = bar.add_task(
                run.status, total=run.progress.total_steps, of="?", reward="-", health=""
            )
            show(bar, task, run)
            for event in client.events(run.id):
                on_event(client, bar, task, run.id, event, run.progress.key)
    final = client.get_run(run.id)
    if output == Output.table:
        say(final.id, final.status, style=STATUS_STYLE.get(final.status))
    return 0 if final.status == "SUCCEEDED" else EXIT_RUN_FAILED


def show(bar: Progress, task: TaskID, run: RunOut) -> None:
    health = "healthy" if run.health.status == "ok" else f"{run.health.status}: {run.health.reason}"
    bar.update(
        task,
        description=run.status,
        total=run.progress.total_steps,
        of=run.progress.total_steps or "?",
        completed=run.progress.step or 0,
        health=clean(health),
    )
    if REWARD_KEY in run.metrics.latest:
        bar.update(task, reward=number(run.metrics.latest[REWARD_KEY]))


def on_event(
    client: Client, bar: Progress, task: TaskID, run_id: str, event: Event, key: str = STEP_KEY
) -> None:
    if event.kind == "status":
        data = event.data
        moved = data["from_status"] != data["to_status"]
        text = f"{data['at']} {data['to_status'] if moved else ''} {data['reason']}"
        bar.console.print(Text(clean(text), style="bold" if moved else "dim"))
        # The stream resumes by itself across a service restart; so does this view.
        with contextlib.suppress(Unreachable):
            show(bar, task, client.get_run(run_id))
    elif event.kind == "metrics":
        values = event.data["values"]
        if isinstance(values.get(key), int | float):
            bar.update(task, completed=values[key])
        if REWARD_KEY in values:
            bar.update(task, reward=number(values[REWARD_KEY]))


def cancel(
    run_id: str,
    at_checkpoint: Annotated[
        bool,
        typer.Option(
            "--at-checkpoint",
            help="Stop an active run right after its next complete checkpoint (retry resumes "
            "it from there)",
        ),
    ] = False,
    within: Annotated[
        float | None,
        typer.Option(
            "--within",
            min=0,
            help="With --at-checkpoint: stop anyway after this many seconds (default: the "
            "service's RLRUN_DEFAULT_STOP_WITHIN_S)",
        ),
    ] = None,
    server: ServerOpt = None,
    token: TokenOpt = None,
    output: OutputOpt = Output.table,
) -> None:
    """Cancel a queued run, or stop an active one (now, or at its next checkpoint)."""
    if within is not None and not at_checkpoint:
        raise typer.BadParameter("--within goes with --at-checkpoint", param_hint="--within")
    with connect(server, token) as client:
        run = client.cancel_run(run_id, at_checkpoint, within)
    if output == Output.json:
        emit_json(run)
    elif run.stop is not None and not run.stop_requested:
        by = f" by {run.stop.by:%H:%M:%S} UTC" if run.stop.by else ""
        say(run.id, run.status, f"(stops at its next checkpoint{by})")
    else:
        say(run.id, run.status, "(stop requested)" if run.stop_requested else "")


class ResumeFrom(StrEnum):
    checkpoint = "checkpoint"
    scratch = "scratch"


def retry(
    run_id: str,
    from_: Annotated[
        ResumeFrom,
        typer.Option("--from", help="Resume from the run's newest checkpoint, or from scratch"),
    ] = ResumeFrom.checkpoint,
    server: ServerOpt = None,
    token: TokenOpt = None,
    output: OutputOpt = Output.table,
) -> None:
    """Start the next attempt of an ended run (its own Ray job, queued at the head of its
    priority)."""
    with connect(server, token) as client:
        run = client.retry_run(run_id, from_.value)
    if output == Output.json:
        emit_json(run)
    else:
        say(run.id, run.status, f"attempt {run.attempt} from {from_.value}")
