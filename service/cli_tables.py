"""Tables the ``rlrun`` command prints: whole cells, fitted to the width by dropping columns.

A cell is never cut and a word never split: when the columns do not fit the console (80
columns when output is not a terminal, or ``COLUMNS``), the columns marked droppable go first,
highest ``drop`` first; kept columns (ids) stay whole even past the width. One column may be a
sentence that wraps between words.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rich.cells import cell_len
from rich.console import Console
from rich.table import Table
from rich.text import Text

GAP = 2  # between two columns (box=None: one space of padding each side)


@dataclass(frozen=True)
class Column:
    name: str
    drop: int = 0  # 0: always shown; else dropped when short of room, highest first
    sentence: bool = False  # may wrap between words (the table's last column)


def _widths(column: Column, cells: Sequence[Text]) -> tuple[int, int]:
    """(least, full) width: a sentence needs only its longest word."""
    texts = [column.name, *(c.plain for c in cells)]
    full = max(cell_len(t) for t in texts)
    if not column.sentence:
        return full, full
    return max(cell_len(w) for t in texts for w in (t.split() or [""])), full


def fitted(columns: Sequence[Column], rows: Sequence[Sequence[Text]], width: int) -> list[int]:
    """The indexes of the columns to show within ``width``."""
    sizes = [_widths(c, [r[i] for r in rows]) for i, c in enumerate(columns)]
    kept = list(range(len(columns)))

    def least(indexes: list[int]) -> int:
        return sum(sizes[i][0] for i in indexes) + GAP * (len(indexes) - 1)

    for i in sorted((i for i, c in enumerate(columns) if c.drop), key=lambda i: -columns[i].drop):
        if least(kept) <= width:
            break
        kept.remove(i)
    return kept


def print_table(
    console: Console,
    columns: Sequence[Column],
    rows: Sequence[Sequence[Text]],
    empty: str | None = None,
) -> None:
    """Print ``rows`` under ``columns`` (one ``Text`` per cell), fitted to the console; with
    no rows, the line ``empty`` instead when given."""
    if not rows and empty is not None:
        console.print(Text(empty, style="dim"))
        return
    kept = fitted(columns, rows, console.width)
    sizes = [_widths(columns[i], [r[i] for r in rows]) for i in kept]
    table = Table(box=None, pad_edge=False, show_edge=False)
    for i, (least, full) in zip(kept, sizes, strict=True):
        col = columns[i]
        table.add_column(
            col.name,
            no_wrap=not col.sentence,
            min_width=least,
            max_width=None if col.sentence else full,
            overflow="fold" if col.sentence else "ignore",
        )
    for row in rows:
        table.add_row(*(row[i] for i in kept))
    need = sum(least for least, _ in sizes) + GAP * (len(sizes) - 1)
    if need > console.width:  # past the width rather than cut a kept column
        console = Console(
            file=console.file,
            width=need,
            highlight=False,
            force_terminal=console.is_terminal,
            color_system=console.color_system,  # type: ignore[arg-type]
        )
    console.print(table)
