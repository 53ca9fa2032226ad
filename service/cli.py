"""The ``rlrun`` command: serve the API, migrate the database, and talk to a running service."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer
from rich.console import Console
from rich.table import Table

from service.sse import parse_sse

app = typer.Typer(
    help="rlrun: asynchronous RL training runs on a shared Ray cluster.", no_args_is_help=True
)
console = Console()

ServerOpt = Annotated[str, typer.Option("--server", envvar="RLRUN_SERVER", help="Service URL")]
DEFAULT_SERVER = "http://127.0.0.1:8000"


@app.command()
def serve(
    host: Annotated[str, typer.Option(help="Address to bind")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to bind")] = 8000,
) -> None:
    """Run the service (with RLRUN_RAY_ADDRESS=local, it starts and stops a local Ray head)."""
    import uvicorn

    from service.app import create_app

    uvicorn.run(create_app(), host=host, port=port, log_level="info")


@app.command()
def migrate() -> None:
    """Upgrade the database in RLRUN_DATABASE_URL to the newest schema."""
    from service.settings import Settings
    from service.store.db import upgrade

    upgrade(Settings().database_url)
    console.print("database is at head")


def _call(method: str, server: str, path: str, **kwargs: Any) -> Any:
    try:
        resp = httpx.request(method, f"{server}{path}", timeout=30, **kwargs)
    except httpx.HTTPError as exc:
        console.print(f"[red]cannot reach {server}: {exc}[/red]")
        raise typer.Exit(2) from exc
    if resp.status_code >= 400:
        console.print_json(resp.text)
        raise typer.Exit(1)
    return resp.json()


@app.command()
def submit(
    spec: Annotated[Path, typer.Argument(help="JSON run spec file, or - for standard input")],
    server: ServerOpt = DEFAULT_SERVER,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Show the plan; store nothing")
    ] = False,
) -> None:
    """Submit a run spec."""
    text = sys.stdin.read() if str(spec) == "-" else spec.read_text()
    run = _call("POST", server, "/runs", json=json.loads(text), params={"dry_run": dry_run})
    if dry_run:
        console.print_json(data=run)
    else:
        console.print(f"{run['id']}  {run['status']}")


@app.command("list")
def list_runs(
    server: ServerOpt = DEFAULT_SERVER,
    status: Annotated[str | None, typer.Option(help="Only runs in this status")] = None,
    team: Annotated[str | None, typer.Option(help="Only this team's runs")] = None,
    limit: int = 20,
) -> None:
    """List runs, newest first."""
    params: dict[str, Any] = {"limit": limit}
    if status:
        params["status"] = status
    if team:
        params["team"] = team
    page = _call("GET", server, "/runs", params=params)
    table = Table("id", "name", "team", "status", "health", "created")
    for r in page["items"]:
        table.add_row(
            r["id"], r["name"], r["team"], r["status"], r["health"]["status"], r["created_at"]
        )
    console.print(table)


@app.command()
def status(
    run_id: str,
    server: ServerOpt = DEFAULT_SERVER,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Stream status changes and steps until the end")
    ] = False,
) -> None:
    """Show one run: status, Ray's view, progress and latest metrics."""
    run = _call("GET", server, f"/runs/{run_id}")
    console.print(
        f"[bold]{run['id']}[/bold] {run['name']}  {run['status']}  health={run['health']['status']}"
    )
    if run["ray"]["message"]:
        console.print(f"ray: {run['ray']['status']} {run['ray']['message']}")
    progress = run["progress"]
    if progress["step"] is not None:
        console.print(f"progress: {progress['step']}/{progress['total_steps'] or '?'} syncs")
    for key, value in run["metrics"]["latest"].items():
        console.print(f"  {key} = {value}")
    if follow:
        _follow(server, run_id)


REWARD_KEYS = ("critic/score/mean", "critic/score/max", "critic/score/min")


def _follow(server: str, run_id: str) -> None:
    """Print each status change and each step's reward from the run's event stream; reconnect
    with Last-Event-ID when the connection drops, stop at the stream's end."""
    last_id: str | None = None
    while True:
        headers = {"Last-Event-ID": last_id} if last_id else {}
        try:
            with httpx.stream(
                "GET",
                f"{server}/runs/{run_id}/events",
                headers=headers,
                timeout=httpx.Timeout(10, read=60),
            ) as resp:
                if resp.status_code >= 400:
                    console.print_json(resp.read().decode())
                    raise typer.Exit(1)
                for kind, data, event_id in parse_sse(resp.iter_lines()):
                    last_id = event_id or last_id
                    if kind == "end":
                        return
                    _print_event(kind, data)
        except httpx.HTTPError as exc:
            console.print(f"[yellow]stream interrupted ({exc}); reconnecting[/yellow]")
            time.sleep(1)


def _print_event(kind: str, data: Any) -> None:
    if kind == "status":
        if data["from_status"] == data["to_status"]:
            console.print(f"[dim]{data['at']}[/dim] {data['reason']}")
        else:
            console.print(
                f"[dim]{data['at']}[/dim] [bold]{data['to_status']}[/bold] {data['reason']}"
            )
    elif kind == "metrics":
        values = data["values"]
        shown = [f"{k.rsplit('/', 1)[-1]}={values[k]}" for k in REWARD_KEYS if k in values]
        if "training/global_step" in values:
            shown.append(f"trainer_step={values['training/global_step']}")
        shown += [f"{k}={v}" for k, v in values.items() if k.startswith("val-core/")]
        if shown:
            console.print(f"step {data['step']}: reward " + " ".join(shown))


@app.command()
def cancel(run_id: str, server: ServerOpt = DEFAULT_SERVER) -> None:
    """Cancel a queued run, or stop an active one."""
    run = _call("POST", server, f"/runs/{run_id}/cancel")
    console.print(
        f"{run['id']}  {run['status']}" + ("  (stop requested)" if run["stop_requested"] else "")
    )
