"""Accelerator-hours allocated (``rlrun usage``)."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table
from rich.text import Text

from service.cli.common import clean, connect, console, emit_json, say
from service.cli.options import Output, OutputOpt, ServerOpt, TokenOpt


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
