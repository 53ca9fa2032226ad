"""What a run tells: its log (``rlrun logs``) and its metrics (``rlrun metrics``)."""

from __future__ import annotations

import json
import sys
from fnmatch import fnmatchcase
from typing import Annotated

import typer
from rich.table import Table
from rich.text import Text

from service.cli.common import clean, connect, console, emit_json, number, say
from service.cli.options import FollowOpt, Output, OutputOpt, ServerOpt, TokenOpt
from service.cli_tables import Column, print_table


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
