"""``rlrun samples ID``: a run's rollout samples, newest first."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.text import Text

from service.cli.common import clean, connect, console, emit_json, number, say
from service.cli.options import Output, OutputOpt, ServerOpt, TokenOpt
from service.cli_tables import Column, print_table

COLUMNS = (
    Column("step"),
    Column("score"),
    Column("prompt", drop=2),
    Column("response", drop=1),
    Column("prompt id", drop=3),
)
WIDTH = 60


def short(text: str) -> str:
    one = clean(text).replace("\n", " ").replace("\t", " ")
    return one if len(one) <= WIDTH else one[: WIDTH - 1] + "…"


def samples(
    run_id: str,
    step: Annotated[int | None, typer.Option(help="Only this step's samples")] = None,
    min_score: Annotated[float | None, typer.Option(help="Scored at least this")] = None,
    max_score: Annotated[float | None, typer.Option(help="Scored at most this")] = None,
    q: Annotated[str | None, typer.Option(help="Only samples whose text holds this")] = None,
    prompt_id: Annotated[str | None, typer.Option(help="Only this prompt, at every step")] = None,
    limit: Annotated[int, typer.Option(help="How many samples")] = 20,
    cursor: Annotated[int | None, typer.Option(help="Continue after this page")] = None,
    server: ServerOpt = None,
    token: TokenOpt = None,
    output: OutputOpt = Output.table,
) -> None:
    """A run's rollout samples, newest first: step, score, prompt and response (cut to the
    width; --output json has them whole, as the service keeps them)."""
    with connect(server, token) as client:
        page = client.samples(run_id, step, min_score, max_score, q, prompt_id, cursor, limit)
    if output == Output.json:
        emit_json(page)
        return
    rows = [
        [
            Text(str(s.step)),
            Text(number(s.score)),
            Text(short(s.input)),
            Text(short(s.output)),
            Text(s.prompt_id),
        ]
        for s in page.items
    ]
    print_table(console, COLUMNS, rows)
    say(f"{page.kept} samples kept, {page.skipped} lines skipped", style="dim")
    if page.next_cursor:
        say(f"more: --cursor {page.next_cursor}", style="dim")
