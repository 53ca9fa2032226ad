"""The ``rlrun`` command: serve the API, migrate the database, and talk to a running service.

Every command that talks to the service goes through ``service.client``. Exit codes: 0 done
(``--follow``: the run SUCCEEDED), 1 the followed run ended otherwise, 2 bad usage, 3 the
service refused the request (its problem is printed), 4 the service cannot be reached.
"""

from __future__ import annotations

import contextlib
import json
import sys
import unicodedata
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
import yaml
from pydantic import BaseModel, ValidationError
from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TextColumn
from rich.table import Table
from rich.text import Text

from service.client import ApiError, Client, Event, Unreachable
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

EXIT_RUN_FAILED, EXIT_REFUSED, EXIT_UNREACHABLE = 1, 3, 4
STEP_KEY = "fully_async/count/current_param_version"
REWARD_KEY = "critic/score/mean"
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
    typer.Option("--server", envvar="RLRUN_URL", help="Service URL [default: 127.0.0.1:8000]"),
]
TokenOpt = Annotated[
    str | None,
    typer.Option("--token", envvar="RLRUN_TOKEN", help="Bearer token", show_default=False),
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
    host: Annotated[str, typer.Option(help="Address to bind")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to bind")] = 8000,
) -> None:
    """Run the service (with RLRUN_RAY_ADDRESS=local, it starts and stops a local Ray head).

    Authentication is on whenever HOST is not a loopback address (RLRUN_AUTH=auto). On
    SIGTERM, live event streams end at once and other open requests get RLRUN_SHUTDOWN_GRACE_S
    to finish."""
    import uvicorn

    from service.app import create_app
    from service.settings import Settings

    try:
        settings = Settings(listen_host=host)
    except ValidationError as exc:
        # One line per error naming the variable, not a traceback.
        for error in exc.errors():
            where = "".join(f"RLRUN_{str(part).upper()}: " for part in error["loc"][:1])
            say(f"{where}{error['msg'].removeprefix('Value error, ')}", style="red", to=errors)
        raise typer.Exit(2) from None
    # Hand the interpreter lock over every millisecond (default 5): the event loop, which
    # answers /healthz and feeds live streams, waits less behind busy worker threads.
    sys.setswitchinterval(0.001)
    uvicorn.run(
        create_app(settings),
        host=host,
        port=port,
        log_level="info",
        timeout_graceful_shutdown=max(1, round(settings.shutdown_grace_s)),
        # Proxy headers only from the proxies named: otherwise any caller could name its address.
        proxy_headers=bool(settings.forwarded_allow_ips.strip()),
        forwarded_allow_ips=settings.forwarded_allow_ips.strip() or None,
    )


@app.command()
def migrate() -> None:
    """Upgrade the database in RLRUN_DATABASE_URL to the newest schema."""
    from service.settings import Settings
    from service.store.db import upgrade

    upgrade(Settings().database_url)
    console.print("database is at head")


@verl_app.command("add")
def verl_add(version: Annotated[str, typer.Argument(help="a verl release, e.g. 0.9.0")]) -> None:
    """Download verl VERSION's wheel (no dependencies) into RLRUN_VERL_CACHE_DIR."""
    from service.recipes.verl import versions
    from service.settings import Settings

    try:
        settings = Settings()
        root = versions.add(version, Path(settings.verl_cache_dir), settings.verl_index_json_url)
    except (ValueError, OSError) as exc:
        say(str(exc), style="red", to=errors)
        raise typer.Exit(1) from exc
    say(f"verl {version} is available at {root}")


def load_spec(path: str, preset: str | None, sets: list[str]) -> dict[str, Any]:
    """A spec file (JSON or YAML; ``-`` for standard input) with ``--preset`` and each
    ``--set dotted.key=value`` applied (values read as YAML: numbers, booleans, lists)."""
    text = sys.stdin.read() if path == "-" else Path(path).read_text()
    spec = yaml.safe_load(text) if text.strip() else {}
    if not isinstance(spec, dict):
        raise typer.BadParameter("the spec must be a mapping", param_hint="SPEC")
    if preset:
        spec["preset"] = preset
    for item in sets:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise typer.BadParameter(f"{item!r} is not key=value", param_hint="--set")
        *parents, leaf = key.split(".")
        node = spec
        for part in parents:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise typer.BadParameter(f"{key}: {part} is not a mapping", param_hint="--set")
            node = child
        node[leaf] = yaml.safe_load(raw) if raw else ""
    return spec


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
    width = max((len(r.id) for r in page.items), default=2)
    table = Table(box=None, pad_edge=False)
    table.add_column("id", no_wrap=True, min_width=width)
    for name in ("name", "team", "recipe", "status", "health", "step", "reward", "age"):
        table.add_column(name, overflow="fold")
    now = datetime.now(UTC)
    for r in page.items:
        table.add_row(
            Text(r.id),
            Text(clean(r.name)),
            Text(clean(r.team)),
            Text(clean(r.recipe)),
            Text(r.status, style=STATUS_STYLE.get(r.status, "")),
            Text(clean(r.health.status), style="" if r.health.status == "ok" else "red"),
            Text(step_of(r.progress.step, r.progress.total_steps)),
            Text(number(r.reward)),
            Text(ago(now, r.created_at)),
        )
    console.print(table)
    if page.next_cursor:
        say(f"more: --cursor {page.next_cursor}", style="dim")


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
    if run.queue_reason:
        say(f"queued: {run.queue_reason}")
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


@app.command()
def logs(
    run_id: str,
    follow: FollowOpt = False,
    tail: Annotated[int | None, typer.Option(help="Only the last N lines")] = None,
    server: ServerOpt = None,
    token: TokenOpt = None,
) -> None:
    """Print the run's job log (the service's copy); with --follow, until the run ends."""
    with connect(server, token) as client:
        if follow:
            for text in client.follow_logs(run_id, tail=tail):
                sys.stdout.write(clean(text, keep="\n\t"))
                sys.stdout.flush()
        else:
            sys.stdout.write(clean(client.logs(run_id, tail=tail).text, keep="\n\t"))


@app.command()
def metrics(
    run_id: str,
    keys: Annotated[bool, typer.Option("--keys", help="List every key the run logs")] = False,
    key: Annotated[
        list[str] | None, typer.Option("--key", "-k", help="History of this key (repeatable)")
    ] = None,
    max_points: Annotated[int, typer.Option(help="Downsample above this many points")] = 1000,
    server: ServerOpt = None,
    token: TokenOpt = None,
    output: OutputOpt = Output.table,
) -> None:
    """A run's latest metrics; --keys lists every key it logs, --key K its history
    (step, value and the min and max of each downsampled bucket)."""
    with connect(server, token) as client:
        if keys:
            names: Any = client.metric_keys(run_id)
        elif key:
            series = client.metrics(run_id, key, max_points)
        else:
            latest = client.get_run(run_id).metrics
    if output == Output.json:
        emit_json(names if keys else series if key else latest)
    elif keys:
        for name in names:
            say(name)
    elif key:
        table = Table("key", "step", "value", "min", "max", box=None, pad_edge=False)
        for name, points in series.series.items():
            for p in points:
                table.add_row(
                    Text(clean(name)), str(p.step), number(p.value), number(p.min), number(p.max)
                )
        console.print(table)
    else:
        say(f"step {latest.step}")
        for name, value in latest.latest.items():
            say(f"  {name} = {number(value)}")


@app.command()
def script(run_id: str, server: ServerOpt = None, token: TokenOpt = None) -> None:
    """The bash script that submits the run's job by hand with `ray job submit`."""
    with connect(server, token) as client:
        sys.stdout.write(clean(client.script(run_id), keep="\n\t"))


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
    nodes = Table("node", "accelerators free/total", "CPUs free/total", box=None, pad_edge=False)
    for node in view["nodes"]:
        nodes.add_row(*(Text(clean(c)) for c in node_cells(node)))
    console.print(nodes)
    active = Table("running", "name", "team", "status", "accelerators", box=None, pad_edge=False)
    for r in view["active"]:
        active.add_row(
            *(Text(clean(r[k])) for k in ("id", "name", "team", "status", "accelerators"))
        )
    console.print(active)
    for team, use in view["teams"].items():
        say(f"team {team}: {use['accelerators']} held, quota {use['quota'] or 'none'}")
    queue = Table("#", "queued", "name", "team", "accelerators", "reason", box=None, pad_edge=False)
    for q in view["queue"]:
        queue.add_row(
            *(
                Text(clean(q[k]))
                for k in ("position", "id", "name", "team", "accelerators", "reason")
            )
        )
    console.print(queue)


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

    db = Database(Settings().database_url)
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
        user=f"cli:{getpass.getuser()}",
        team=None,
        role="admin",
        token_id=None,
        action=action,
        client=f"cli@{socket.gethostname()}",
        target=target,
    )


@token_app.command("create")
def token_create(
    user: Annotated[str, typer.Option(help="Who the token is for")],
    team: Annotated[str, typer.Option(help="The team it acts for")],
    role: Annotated[str, typer.Option(help="viewer, member or admin")] = "member",
) -> None:
    """Make a token and print its secret (shown this once; only its hash is stored)."""
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
    """Revoke a token: the next request with it is refused."""
    from service.errors import NotFound
    from service.store import tokens

    try:
        with _database() as db, db.transaction() as session:
            tokens.revoke(session, token_id)
            _audited_on_host(session, "token.revoke", token_id)
    except NotFound as exc:
        say(exc.detail, style="red", to=errors)
        raise typer.Exit(1) from exc
    say(f"{token_id} revoked")


if __name__ == "__main__":
    app()
