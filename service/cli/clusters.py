"""The cluster side: the script that submits a run's job by hand, the cluster's view, and the
verl versions specs may name (``rlrun verl add``)."""

from __future__ import annotations

import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.text import Text

from service.cli.common import clean, connect, console, emit_json, errors, say
from service.cli.options import Output, OutputOpt, ServerOpt, TokenOpt
from service.cli_tables import Column, print_table

verl_app = typer.Typer(
    help="verl versions specs may name (verl_version), and the CPU smoke run's assets.",
    no_args_is_help=True,
)


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


@verl_app.command("make-smoke-assets")
def make_smoke_assets(
    directory: Annotated[Path, typer.Argument(help="where to write model/ and data/")],
    warm_start_steps: Annotated[
        int,
        typer.Option(min=0, help="supervised steps on the answer format first (0: random weights)"),
    ] = 0,
    learn: Annotated[
        bool,
        typer.Option(
            "--learn",
            help="the cpu-learn preset's assets: sums of 0-2, warm-started on the format alone",
        ),
    ] = False,
    vl: Annotated[
        bool,
        typer.Option(
            "--vl", help="cpu-smoke-vl's tiny Qwen3-VL, processor and geo3k-style image data"
        ),
    ] = False,
    output: OutputOpt = Output.table,
) -> None:
    """Make the cpu-smoke preset's tiny Qwen2 model, tokenizer and gsm8k-style parquet data in
    DIRECTORY (with --learn, cpu-learn's; with --vl, cpu-smoke-vl's), the same bytes each time;
    needs the verl-cpu extra (--output json: what was written)."""
    if vl and (warm_start_steps or learn):
        say("--warm-start-steps and --learn apply to the text model only, not with --vl",
            style="red", to=errors)  # fmt: skip
        raise typer.Exit(2)
    try:
        from jobs.verl_cpu import assets, vl_assets
    except ImportError as exc:  # the package itself is always there: a dependency is missing
        say(f"the verl-cpu extra is not installed ({exc})", style="red", to=errors)
        raise typer.Exit(1) from exc
    try:
        if vl:
            summary = vl_assets.make(directory)
        else:
            task = assets.LEARN if learn else assets.Task(warm_start_steps=warm_start_steps)
            summary = assets.make(directory, task=task)
    except (ImportError, OSError) as exc:
        say(str(exc), style="red", to=errors)
        raise typer.Exit(1) from exc
    if output == Output.json:
        emit_json(summary)
    else:
        total = sum(summary["bytes"].values())
        say(f"model {summary['model']} ({summary['parameters']:,} parameters), data "
            f"{summary['train_files']}, {summary['val_files']}: {total / 1e6:.1f} MB")  # fmt: skip


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
    print_table(console, list(ACTIVE.values()), cells(view["active"], ACTIVE), "nothing running")
    for team, use in view["teams"].items():
        say(f"team {team}: {use['accelerators']} held, quota {use['quota'] or 'none'}")
    print_table(console, list(QUEUE.values()), cells(view["queue"], QUEUE), "nothing queued")


NODE_COLUMNS = (
    Column("node"),
    Column("accelerators free/total"),
    Column("CPUs free/total", drop=1),
)
# The key of a row each column shows.
ACTIVE = {
    "id": Column("running"),
    "name": Column("name", drop=1),
    "team": Column("team", drop=2),
    "status": Column("status"),
    "accelerators": Column("accelerators"),
}
QUEUE = {
    "position": Column("#"),
    "id": Column("queued"),
    "name": Column("name", drop=1),
    "team": Column("team", drop=2),
    "accelerators": Column("accelerators", drop=3),
    "reason": Column("reason", sentence=True),
}


def cells(rows: list[dict[str, Any]], keys: Iterable[str]) -> list[list[Text]]:
    return [[Text(clean("" if r.get(k) is None else r[k])) for k in keys] for r in rows]


def node_cells(node: dict[str, Any]) -> tuple[str, str, str]:
    total, free = node.get("total", {}), node.get("available", {})
    kind = "NPU" if total.get("NPU") else "GPU"
    return (
        str(node["id"]),
        f"{free.get(kind, 0):g}/{total.get(kind, 0):g} {kind}",
        f"{free.get('CPU', 0):g}/{total.get('CPU', 0):g}",
    )
