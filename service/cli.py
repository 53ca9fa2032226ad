"""The ``rlrun`` command: serve the API, migrate the database, and talk to a running service.

Every command that talks to the service goes through ``service.client``. Exit codes: 0 done
(``--follow``: the run SUCCEEDED), 1 the followed run ended otherwise, 2 bad usage, 3 the
service refused the request (its problem is printed), 4 the service cannot be reached.
"""

from __future__ import annotations

import contextlib
import errno
import gc
import json
import re
import socket
import sys
import time
import unicodedata
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from enum import StrEnum
from fnmatch import fnmatchcase
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer
import yaml
from pydantic import BaseModel, ValidationError
from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TextColumn
from rich.table import Table
from rich.text import Text

from service.cli_tables import Column, print_table
from service.client import (
    DEFAULT_HOST,
    DEFAULT_PORT,
    DEFAULT_URL,
    TOKEN_ENV,
    URL_ENV,
    ApiError,
    Client,
    Event,
    Unreachable,
)
from service.clock import utcnow
from service.metrics.keys import REWARD_KEY, STEP_KEY
from service.wire import RunOut

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

app = typer.Typer(
    help="rlrun: asynchronous RL training runs on a shared Ray cluster.", no_args_is_help=True
)
console = Console(highlight=False)
errors = Console(stderr=True, highlight=False)
verl_app = typer.Typer(help="verl versions specs may name (verl_version).", no_args_is_help=True)
app.add_typer(verl_app, name="verl")

EXIT_RUN_FAILED, EXIT_USAGE, EXIT_REFUSED, EXIT_UNREACHABLE = 1, 2, 3, 4
STATUS_STYLE = {
    "QUEUED": "yellow",
    "SUBMITTED": "cyan",
    "RUNNING": "blue",
    "SUCCEEDED": "green",
    "FAILED": "red",
    "LOST": "red",
    "STOPPED": "magenta",
    "CANCELLED": "dim",
}


class Output(StrEnum):
    table = "table"
    json = "json"


ServerOpt = Annotated[
    str | None,
    typer.Option("--server", envvar=URL_ENV, help=f"Service URL [default: {DEFAULT_URL}]"),
]
TokenOpt = Annotated[
    str | None,
    typer.Option("--token", envvar=TOKEN_ENV, help="Bearer token", show_default=False),
]
OutputOpt = Annotated[Output, typer.Option("--output", "-o", help="table or json")]
FollowOpt = Annotated[bool, typer.Option("--follow", "-f", help="Follow until the run ends")]


def clean(value: object, keep: str = "") -> str:
    """A user string made safe for a terminal: control characters (escape sequences
    included) and format characters (bidi overrides) removed, except those in ``keep``."""
    return "".join(
        ch for ch in str(value) if ch in keep or unicodedata.category(ch) not in ("Cc", "Cf")
    )


def say(*parts: object, style: str | None = None, to: Console = console) -> None:
    """Print user strings as they are: never read as rich markup."""
    to.print(Text(" ".join(clean(p) for p in parts), style=style or ""), soft_wrap=True)


def emit_json(data: Any) -> None:
    if isinstance(data, BaseModel):
        data = data.model_dump(mode="json")
    sys.stdout.write(json.dumps(data, indent=2) + "\n")


@contextmanager
def connect(server: str | None, token: str | None) -> Iterator[Client]:
    """A client; the errors it raises become a printed problem and an exit code."""
    try:
        with Client(server, token) as client:
            yield client
    except ApiError as exc:
        say(f"error {exc.status}: {exc.title}: {exc.detail}", style="red", to=errors)
        for e in exc.errors:
            say(f"  {e.field}: {e.msg}", to=errors)
        if exc.body.get("suggestion"):
            say(f"  suggestion: {exc.body['suggestion']}", to=errors)
        raise typer.Exit(EXIT_REFUSED) from exc
    except Unreachable as exc:
        say(str(exc), style="red", to=errors)
        raise typer.Exit(EXIT_UNREACHABLE) from exc


@app.command()
def serve(
    host: Annotated[str, typer.Option(help="Address to bind")] = DEFAULT_HOST,
    port: Annotated[
        int, typer.Option(help="Port to bind (pick another if it is taken)", min=0, max=65535)
    ] = DEFAULT_PORT,
    probe_port: Annotated[
        int | None,
        typer.Option(
            help="Also answer /healthz and /readyz on this port, from a process of their own"
        ),
    ] = None,
) -> None:
    """Run the service on HOST:PORT (with RLRUN_RAY_ADDRESS=local, it starts and stops a
    local Ray head); a port already in use is refused before anything starts.

    Authentication is on whenever HOST is not a loopback address (RLRUN_AUTH=auto). On
    SIGTERM, live event streams end at once and other open requests get RLRUN_SHUTDOWN_GRACE_S
    to finish."""
    import uvicorn

    from service.app import create_app
    from service.settings import Settings

    try:
        given: dict[str, Any] = {"listen_host": host, "listen_port": port}
        if probe_port is not None:  # else RLRUN_PROBE_PORT, if set
            given["probe_port"] = probe_port
        settings = Settings(**given)
    except ValidationError as exc:
        # One line per error naming the variable, not a traceback.
        for error in exc.errors():
            where = "".join(f"RLRUN_{str(part).upper()}: " for part in error["loc"][:1])
            say(f"{where}{error['msg'].removeprefix('Value error, ')}", style="red", to=errors)
        raise typer.Exit(2) from None
    if problem := port_problem(host, port):
        usage_error(problem)
    # Hand the interpreter lock over every millisecond (default 5): the event loop, which
    # answers /healthz and feeds live streams, waits less behind busy worker threads.
    sys.setswitchinterval(0.001)
    served = create_app(settings)
    # What the imports and the app made lives as long as the process: out of the cyclic
    # collector's sight, so that a full collection walks only what requests leave behind (it
    # walked some 160,000 objects, a pause of 100-250 ms on every request in flight).
    gc.collect()
    gc.freeze()
    uvicorn.run(
        served,
        host=host,
        port=port,
        log_level="info",
        access_log=settings.access_log,
        timeout_graceful_shutdown=max(1, round(settings.shutdown_grace_s)),
        # Proxy headers only from the proxies named: otherwise any caller could name its address.
        proxy_headers=bool(settings.forwarded_allow_ips),
        forwarded_allow_ips=settings.forwarded_allow_ips or None,
    )


def port_problem(host: str, port: int) -> str | None:
    """Why ``host:port`` cannot be served, found by binding it as uvicorn will (address reuse
    on), before the service starts a Ray head only to fail at the end of its start-up."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        return f"--host {host}: {exc.strerror}"
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return f"port {port} on {host} is in use: pick another with --port"
            return f"cannot bind {host}:{port}: {exc.strerror or exc}"
    return None


@app.command()
def migrate() -> None:
    """Upgrade the database in RLRUN_DATABASE_URL to the newest schema."""
    from service.settings import Settings
    from service.store.db import upgrade

    upgrade(Settings().database_url.get_secret_value())
    console.print("database is at head")


@verl_app.command("add")
def verl_add(
    version: Annotated[str, typer.Argument(help="a verl release, e.g. 0.9.0")],
    output: OutputOpt = Output.table,
) -> None:
    """Download verl VERSION's wheel (no dependencies) into RLRUN_VERL_CACHE_DIR
    (--output json: {"version", "path"})."""
    from service.recipes.verl import versions
    from service.settings import Settings

    try:
        settings = Settings()
        root = versions.add(version, Path(settings.verl_cache_dir), settings.verl_index_json_url)
    except (ValueError, OSError) as exc:
        say(str(exc), style="red", to=errors)
        raise typer.Exit(1) from exc
    if output == Output.json:
        emit_json({"version": version, "path": str(root)})
    else:
        say(f"verl {version} is available at {root}")


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


def usage_error(message: str) -> NoReturn:
    """Bad usage: one line on standard error, exit 2."""
    say(message, style="red", to=errors)
    raise typer.Exit(EXIT_USAGE)


def yaml_problem(exc: yaml.YAMLError) -> str:
    """A parser error in one line: what is wrong and where (1-based line and column)."""
    if isinstance(exc, yaml.MarkedYAMLError):
        mark = exc.problem_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        return f"{exc.problem or exc.context or 'cannot parse'}{where}"
    return " ".join(str(exc).split())


@app.command()
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


@app.command("list")
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
        page = client.list_runs(status or (), team, limit, cursor)
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
    Column("age", drop=4),
)


def step_of(step: int | None, total: int | None) -> str:
    if step is None:
        return ""
    return f"{step}/{total}" if total else str(step)


def number(value: float | str | None) -> str:
    return "" if value is None else str(value) if isinstance(value, str) else f"{value:.4g}"


def ago(now: datetime, then: datetime) -> str:
    seconds = int((now - then).total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{max(seconds, 0)}s"


@app.command()
def status(
    run_id: str,
    follow: FollowOpt = False,
    server: ServerOpt = None,
    token: TokenOpt = None,
    output: OutputOpt = Output.table,
) -> None:
    """Show one run; with --follow, a live progress bar until it ends (exit 0 if it SUCCEEDED)."""
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
                on_event(client, bar, task, run.id, event)
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


def on_event(client: Client, bar: Progress, task: TaskID, run_id: str, event: Event) -> None:
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
        if isinstance(values.get(STEP_KEY), int | float):
            bar.update(task, completed=values[STEP_KEY])
        if REWARD_KEY in values:
            bar.update(task, reward=number(values[REWARD_KEY]))


@app.command()
def cancel(
    run_id: str, server: ServerOpt = None, token: TokenOpt = None, output: OutputOpt = Output.table
) -> None:
    """Cancel a queued run, or stop an active one."""
    with connect(server, token) as client:
        run = client.cancel_run(run_id)
    if output == Output.json:
        emit_json(run)
    else:
        say(run.id, run.status, "(stop requested)" if run.stop_requested else "")


class ResumeFrom(StrEnum):
    checkpoint = "checkpoint"
    scratch = "scratch"


@app.command()
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


@app.command()
def logs(
    run_id: str,
    follow: FollowOpt = False,
    tail: Annotated[int | None, typer.Option(help="Only the last N lines")] = None,
    server: ServerOpt = None,
    token: TokenOpt = None,
    output: OutputOpt = Output.table,
) -> None:
    """Print the run's job log (the service's copy); with --follow, until the run ends.
    With --output json: {"run_id", "text"} (--follow: one such line per new part)."""
    with connect(server, token) as client:
        if follow:
            for text in client.follow_logs(run_id, tail=tail):
                if output == Output.json:
                    sys.stdout.write(json.dumps({"run_id": run_id, "text": text}) + "\n")
                else:
                    sys.stdout.write(clean(text, keep="\n\t"))
                sys.stdout.flush()
        else:
            chunk = client.logs(run_id, tail=tail)
            if output == Output.json:
                emit_json({"run_id": run_id, "text": chunk.text, "complete": chunk.complete})
            else:
                sys.stdout.write(clean(chunk.text, keep="\n\t"))


@app.command()
def metrics(
    run_id: str,
    keys: Annotated[
        str | None,
        typer.Option(
            "--keys",
            help="Only these keys: comma-separated names or patterns, e.g. 'critic/*,val-core/*'",
        ),
    ] = None,
    key: Annotated[
        list[str] | None, typer.Option("--key", "-k", help="History of this key (repeatable)")
    ] = None,
    max_points: Annotated[int, typer.Option(help="Downsample above this many points")] = 1000,
    server: ServerOpt = None,
    token: TokenOpt = None,
    output: OutputOpt = Output.table,
) -> None:
    """Every key the run logs with its latest value and step (--keys filters them); --key K
    its history (step, value and the min and max of each downsampled bucket)."""
    with connect(server, token) as client:
        if key:
            series = client.metrics(run_id, key, max_points)
        else:
            latest = client.latest_metrics(run_id)
    if key:
        if output == Output.json:
            emit_json(series)
            return
        table = Table("key", "step", "value", "min", "max", box=None, pad_edge=False)
        for name, points in series.series.items():
            for p in points:
                table.add_row(
                    Text(clean(name)), str(p.step), number(p.value), number(p.min), number(p.max)
                )
        console.print(table)
        return
    if keys is not None:
        patterns = [p.strip() for p in keys.split(",") if p.strip()]
        latest.latest = {
            k: v for k, v in latest.latest.items() if any(fnmatchcase(k, p) for p in patterns)
        }
    if output == Output.json:
        emit_json(latest)
        return
    rows = [
        [Text(clean(k)), Text(str(v.step)), Text(number(v.value))] for k, v in latest.latest.items()
    ]
    if not rows:
        say("no metrics yet" if keys is None else "no key matches --keys", style="dim")
        return
    print_table(console, METRIC_COLUMNS, rows)


METRIC_COLUMNS = (Column("key"), Column("step", drop=1), Column("value"))


@app.command()
def script(
    run_id: str, server: ServerOpt = None, token: TokenOpt = None, output: OutputOpt = Output.table
) -> None:
    """The bash script that submits the run's job by hand with `ray job submit`
    (--output json: {"run_id", "script"})."""
    with connect(server, token) as client:
        text = client.script(run_id)
    if output == Output.json:
        emit_json({"run_id": run_id, "script": text})
    else:
        sys.stdout.write(clean(text, keep="\n\t"))


@app.command()
def cluster(
    server: ServerOpt = None, token: TokenOpt = None, output: OutputOpt = Output.table
) -> None:
    """Nodes, what each active run holds, teams against quotas, the queue with reasons."""
    with connect(server, token) as client:
        view = client.cluster()
    if output == Output.json:
        emit_json(view)
        return
    nodes = [[Text(clean(c)) for c in node_cells(n)] for n in view["nodes"]]
    unreachable = "" if view.get("ray", {}).get("ok") else ": Ray is not reachable"
    print_table(console, NODE_COLUMNS, nodes, f"no nodes{unreachable}")
    print_table(console, ACTIVE_COLUMNS, cells(view["active"], ACTIVE_KEYS), "nothing running")
    for team, use in view["teams"].items():
        say(f"team {team}: {use['accelerators']} held, quota {use['quota'] or 'none'}")
    print_table(console, QUEUE_COLUMNS, cells(view["queue"], QUEUE_KEYS), "nothing queued")


NODE_COLUMNS = (
    Column("node"),
    Column("accelerators free/total"),
    Column("CPUs free/total", drop=1),
)
ACTIVE_KEYS = ("id", "name", "team", "status", "accelerators")
ACTIVE_COLUMNS = (
    Column("running"),
    Column("name", drop=1),
    Column("team", drop=2),
    Column("status"),
    Column("accelerators"),
)
QUEUE_KEYS = ("position", "id", "name", "team", "accelerators", "reason")
QUEUE_COLUMNS = (
    Column("#"),
    Column("queued"),
    Column("name", drop=1),
    Column("team", drop=2),
    Column("accelerators", drop=3),
    Column("reason", sentence=True),
)


def cells(rows: list[dict[str, Any]], keys: tuple[str, ...]) -> list[list[Text]]:
    return [[Text(clean("" if r.get(k) is None else r[k])) for k in keys] for r in rows]


def node_cells(node: dict[str, Any]) -> tuple[str, str, str]:
    total, free = node.get("total", {}), node.get("available", {})
    kind = "NPU" if total.get("NPU") else "GPU"
    return (
        str(node["id"]),
        f"{free.get(kind, 0):g}/{total.get(kind, 0):g} {kind}",
        f"{free.get('CPU', 0):g}/{total.get('CPU', 0):g}",
    )


token_app = typer.Typer(
    help="API tokens, straight in the database of RLRUN_DATABASE_URL (bootstraps the first admin)."
)
app.add_typer(token_app, name="token")


@contextmanager
def _database() -> Iterator[Any]:
    from service.settings import Settings
    from service.store.db import Database

    db = Database(Settings().database_url.get_secret_value())
    try:
        yield db
    finally:
        db.dispose()


def _audited_on_host(session: Session, action: str, target: str) -> None:
    """An audit row for a change made with the CLI straight in the database: by the host's
    user, from this host."""
    import getpass
    import socket

    from service.store import audit

    audit.record(
        session,
        audit.entry(
            user=f"cli:{getpass.getuser()}",
            team=None,
            role="admin",
            token_id=None,
            action=action,
            client=f"cli@{socket.gethostname()}",
            target=target,
        ),
    )


@token_app.command("create")
def token_create(
    user: Annotated[str, typer.Option(help="Who the token is for")],
    team: Annotated[str, typer.Option(help="The team it acts for")],
    role: Annotated[str, typer.Option(help="viewer, member or admin")] = "member",
    output: OutputOpt = Output.table,
) -> None:
    """Make a token and print its secret (shown this once; only its hash is stored);
    --output json: {"id", "user", "team", "role", "secret"}."""
    from service.api.admin import TokenIn
    from service.store import tokens

    try:
        spec = TokenIn.model_validate({"user": user, "team": team, "role": role})
    except ValueError as exc:
        say(str(exc), style="red", to=errors)
        raise typer.Exit(2) from exc
    with _database() as db, db.transaction() as session:
        row, secret = tokens.create(session, spec.user, spec.team, spec.role, "rlrun token create")
        _audited_on_host(session, "token.create", f"{row.id} {row.role}@{row.team}")
    if output == Output.json:
        emit_json(
            {"id": row.id, "user": row.user, "team": row.team, "role": row.role, "secret": secret}
        )
        return
    say(f"{row.id}  {row.role}@{row.team}  {row.user}", to=errors)
    print(secret)


@token_app.command("list")
def token_list(output: OutputOpt = Output.table) -> None:
    """Every token: id, user, team, role, and when it was revoked."""
    from service.store import tokens

    rows: list[dict[str, Any]] = []
    with _database() as db, db.transaction() as session:
        cursor = None
        while page := tokens.page(session, 500, cursor):
            rows += [
                {
                    "id": t.id,
                    "user": t.user,
                    "team": t.team,
                    "role": t.role,
                    "created_at": t.created_at.isoformat(),
                    "revoked_at": t.revoked_at.isoformat() if t.revoked_at else None,
                }
                for t in page
            ]
            cursor = page[-1].id
    if output == Output.json:
        emit_json(rows)
        return
    table = Table("id", "user", "team", "role", "created", "revoked")
    for r in rows:
        table.add_row(*(Text(clean(r[k] or "")) for k in r))
    console.print(table)


@token_app.command("revoke")
def token_revoke(token_id: str) -> None:
    """Revoke a token: once this answers, every request with it is refused (on PostgreSQL the
    replicas are told at once; the answer waits RLRUN_SIGNIN_CACHE_S, the longest any replica
    trusts a token it was not told of)."""
    from service.errors import NotFound
    from service.settings import Settings
    from service.store import tokens
    from service.store.change_feed import ChangeFeed

    try:
        with _database() as db:
            if db.engine.dialect.name == "postgresql":
                db.before_commit(ChangeFeed(db.url, lambda _change: False).publish)
            with db.transaction() as session:
                tokens.revoke(session, token_id)
                _audited_on_host(session, "token.revoke", token_id)
    except NotFound as exc:
        say(exc.detail, style="red", to=errors)
        raise typer.Exit(1) from exc
    time.sleep(Settings().signin_cache_s)
    say(f"{token_id} revoked")


if __name__ == "__main__":
    app()


webhook_app = typer.Typer(help="Webhooks: run events to a URL, signed.", no_args_is_help=True)
app.add_typer(webhook_app, name="webhook")


@webhook_app.command("add")
def webhook_add(
    url: Annotated[str, typer.Argument(help="Where to send (https, or an allowed address)")],
    event: Annotated[
        list[str] | None,
        typer.Option(
            "--event",
            help=(
                "run.status, run.health, run.failed, run.retrying or metric.threshold "
                "(repeat for more)"
            ),
        ),
    ] = None,
    threshold: Annotated[
        list[str] | None,
        typer.Option(
            "--threshold",
            help="metric.threshold rule 'KEY OP VALUE [for N]', e.g. "
            "'critic/score/mean < 0.1 for 20' (repeat for more)",
        ),
    ] = None,
    status: Annotated[
        list[str] | None, typer.Option("--status", help="run.status only for this status")
    ] = None,
    name_pattern: Annotated[str | None, typer.Option(help="Only runs named like this glob")] = None,
    recipe: Annotated[str | None, typer.Option(help="Only runs of this recipe")] = None,
    slack: Annotated[bool, typer.Option("--slack", help="Send Slack messages")] = False,
    team: Annotated[str | None, typer.Option(help="An admin's: this team (default all)")] = None,
    server: ServerOpt = None,
    token: TokenOpt = None,
    output: OutputOpt = Output.table,
) -> None:
    """Subscribe URL to run events; prints the signing secret, which is shown only now."""
    subscription: dict[str, Any] = {
        "url": url,
        "events": event or ["run.status"],
        "statuses": status or [],
        "format": "slack" if slack else "standard",
    }
    optional = {"name_pattern": name_pattern, "recipe": recipe, "team": team}
    subscription |= {k: v for k, v in optional.items() if v is not None}
    if threshold:
        subscription["thresholds"] = [_threshold_rule(t) for t in threshold]
        if "metric.threshold" not in subscription["events"]:
            subscription["events"] = [*(event or []), "metric.threshold"]
    with connect(server, token) as client:
        hook = client.create_webhook(subscription)
    if output == Output.json:
        emit_json(hook)
        return
    sys.stdout.write(hook["id"] + "\n")
    say(f"secret (shown once): {hook['secret']}", to=errors)


_RULE = re.compile(r"^\s*(\S+?)\s*(<=|>=|<|>)\s*(\S+?)(?:\s+for\s+(\d+))?\s*$")


def _threshold_rule(text: str) -> dict[str, Any]:
    """``critic/score/mean < 0.1 for 20`` as the API's rule (the service validates it)."""
    found = _RULE.match(text)
    if found is None:
        why = f"{text!r} is not 'KEY OP VALUE [for N]'"
        raise typer.BadParameter(why, param_hint="--threshold")
    key, op, value, steps = found.groups()
    return {"key": key, "op": op, "value": value, "for_steps": int(steps or 1)}


@webhook_app.command("list")
def webhook_list(
    server: ServerOpt = None, token: TokenOpt = None, output: OutputOpt = Output.table
) -> None:
    """Subscriptions you may see (no secrets)."""
    with connect(server, token) as client:
        hooks = client.webhooks()
    if output == Output.json:
        emit_json(hooks)
        return
    table = Table("id", "team", "url", "events", "format", "paused", "last", "failures")
    for h in hooks:
        last = h["last_attempt"]
        table.add_row(
            Text(h["id"]),
            Text(clean(h["team"] or "(all)")),
            Text(clean(h["url"])),
            Text(",".join(h["events"])),
            Text(h["format"]),
            Text(clean(h["paused_reason"] or "") if h["paused_at"] else ""),
            Text(str(last["status_code"] or "error") if last else "-"),
            Text(str(h["failures"])),
        )
    console.print(table)


@webhook_app.command("edit")
def webhook_edit(
    hook_id: str,
    threshold: Annotated[
        list[str] | None,
        typer.Option(
            "--threshold",
            help="metric.threshold rule 'KEY OP VALUE [for N]' (repeat for more): these replace "
            "the subscription's rules",
        ),
    ] = None,
    no_thresholds: Annotated[
        bool,
        typer.Option("--no-thresholds", help="Drop every rule (and the metric.threshold event)"),
    ] = False,
    paused: Annotated[
        bool | None, typer.Option("--pause/--resume", help="Stop or restart its deliveries")
    ] = None,
    server: ServerOpt = None,
    token: TokenOpt = None,
    output: OutputOpt = Output.table,
) -> None:
    """Change a subscription's threshold rules, or pause or resume it; the rest stays."""
    if threshold and no_thresholds:
        raise typer.BadParameter("give --threshold or --no-thresholds, not both")
    changes: dict[str, Any] = {} if paused is None else {"paused": paused}
    with connect(server, token) as client:
        if threshold or no_thresholds:
            events = [e for e in client.webhook(hook_id)["events"] if e != "metric.threshold"]
            rules = [_threshold_rule(t) for t in threshold or []]
            changes |= {
                "thresholds": rules,
                "events": [*events, "metric.threshold"] if rules else events,
            }
        if not changes:
            raise typer.BadParameter(
                "nothing to change: give --threshold, --no-thresholds, --pause or --resume"
            )
        hook = client.update_webhook(hook_id, changes)
    if output == Output.json:
        emit_json(hook)
        return
    shown = "; ".join(
        f"{r['key']} {r['op']} {r['value']:g} for {r['for_steps']}" for r in hook["thresholds"]
    )
    state = "paused" if hook["paused_at"] else "active"
    say(f"{hook['id']}: {','.join(hook['events'])}; {shown or 'no threshold rules'}; {state}")


@webhook_app.command("rm")
def webhook_rm(hook_id: str, server: ServerOpt = None, token: TokenOpt = None) -> None:
    """Delete a subscription (deliveries not yet sent go with it)."""
    with connect(server, token) as client:
        client.delete_webhook(hook_id)
    say(f"deleted {hook_id}")


@app.command("usage")
def usage_report(
    start: Annotated[str | None, typer.Option("--from", help="First UTC day (YYYY-MM-DD)")] = None,
    end: Annotated[str | None, typer.Option("--to", help="The day after the last")] = None,
    group_by: Annotated[
        list[str] | None,
        typer.Option("--by", help="team, user, recipe, day or accelerator (repeat for more)"),
    ] = None,
    server: ServerOpt = None,
    token: TokenOpt = None,
    output: OutputOpt = Output.table,
) -> None:
    """Accelerator-hours allocated (submitted to ended), by team unless told; last 30 days."""
    with connect(server, token) as client:
        report = client.usage(start, end, group_by or ())
    if output == Output.json:
        emit_json(report)
        return
    table = Table(*report["group_by"], "accelerator-hours", "runs")
    for row in report["rows"]:
        table.add_row(
            *(Text(clean(str(row[g]))) for g in report["group_by"]),
            Text(f"{row['accelerator_hours']:,.1f}"),
            Text(str(row["runs"])),
        )
    console.print(table)
    say(
        f"{report['start']} to {report['end']}: {report['total_accelerator_hours']:,.1f} "
        "accelerator-hours",
        style="dim",
    )
