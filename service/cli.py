"""The ``rlrun`` command: serve the API, migrate the database, and talk to a running service."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer
from rich.console import Console
from rich.table import Table

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
    from service.db import upgrade
    from service.settings import Settings

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
def status(run_id: str, server: ServerOpt = DEFAULT_SERVER) -> None:
    """Show one run: status, Ray's view, progress and latest metrics."""
    run = _call("GET", server, f"/runs/{run_id}")
    console.print(
        f"[bold]{run['id']}[/bold] {run['name']}  {run['status']}  health={run['health']['status']}"
    )
    if run["ray"]["message"]:
        console.print(f"ray: {run['ray']['status']} {run['ray']['message']}")
    for key, value in run["metrics"]["latest"].items():
        console.print(f"  {key} = {value}")


@app.command()
def cancel(run_id: str, server: ServerOpt = DEFAULT_SERVER) -> None:
    """Cancel a queued run, or stop an active one."""
    run = _call("POST", server, f"/runs/{run_id}/cancel")
    console.print(
        f"{run['id']}  {run['status']}" + ("  (stop requested)" if run["stop_requested"] else "")
    )
