"""Reads by key merged under load (``service/store/merged_reads.py``), on a stand-in read that
records what it is asked and can be held; the real statement on PostgreSQL is
tests/test_run_page.py's."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest

from service.store.merged_reads import MergedReads


class Table:
    """Rows ``(key, value)``; each read recorded, and held while ``gate`` is clear."""

    def __init__(self, keys: str, refused: str = "", fails: bool = False) -> None:
        self.rows = {k: (k, k.upper()) for k in keys}
        self.reads: list[list[Any]] = []
        self.gate = asyncio.Event()
        self.gate.set()
        self.refused = refused
        self.fails = fails

    async def read(self, keys: list[Any]) -> Sequence[Any]:
        self.reads.append(keys)
        await self.gate.wait()
        if self.refused in keys:
            raise ValueError("refused")
        if self.fails:
            raise RuntimeError("the database is away")
        return [self.rows[k] for k in keys if k in self.rows]


async def _held(table: Table, merged: MergedReads, first: str, *then: str) -> list[Any]:
    """``first`` read while the table is held, ``then`` asked meanwhile; their answers."""
    table.gate.clear()
    tasks = [asyncio.ensure_future(merged.row(first))]
    await asyncio.sleep(0)
    tasks += [asyncio.ensure_future(merged.row(k)) for k in then]
    await asyncio.sleep(0)
    table.gate.set()
    return await asyncio.gather(*tasks, return_exceptions=True)


def test_a_read_alone_waits_for_none() -> None:
    async def main() -> None:
        table = Table("ab")
        merged = MergedReads(table.read)
        assert await merged.row("a") == ("a", "A")
        assert await merged.row("z") is None
        assert table.reads == [["a"], ["z"]]

    asyncio.run(main())


def test_keys_asked_meanwhile_are_read_together_each_its_own() -> None:
    async def main() -> None:
        table = Table("abcd")
        merged = MergedReads(table.read)
        got = await _held(table, merged, "a", "b", "c", "c", "z", "d")
        assert got == [("a", "A"), ("b", "B"), ("c", "C"), ("c", "C"), None, ("d", "D")]
        assert table.reads == [["a"], ["b", "c", "z", "d"]]
        # Nothing left under way: the next read is alone again.
        assert await merged.row("b") == ("b", "B") and table.reads[-1] == ["b"]

    asyncio.run(main())


def test_at_most_so_many_keys_a_read() -> None:
    async def main() -> None:
        table = Table("abcde")
        got = await _held(table, MergedReads(table.read, at_most=2), "a", "b", "c", "d", "e")
        assert [row[0] for row in got] == list("abcde")
        assert table.reads == [["a"], ["b", "c"], ["d", "e"]]

    asyncio.run(main())


def test_a_refused_key_fails_its_own_read_only() -> None:
    async def main() -> None:
        table = Table("abc", refused="x")
        merged = MergedReads(table.read, alone_on=ValueError)
        got = await _held(table, merged, "a", "b", "x", "c")
        assert got[:2] == [("a", "A"), ("b", "B")] and got[3] == ("c", "C")
        assert isinstance(got[2], ValueError)
        assert table.reads == [["a"], ["b", "x", "c"], ["b"], ["x"], ["c"]]
        with pytest.raises(ValueError):
            await merged.row("x")

    asyncio.run(main())


def test_a_failed_read_is_each_waiters_error_and_the_next_reads_go_on() -> None:
    async def main() -> None:
        table = Table("abc", fails=True)
        merged = MergedReads(table.read, alone_on=ValueError)
        got = await _held(table, merged, "a", "b", "c")
        assert all(isinstance(g, RuntimeError) for g in got)
        assert table.reads == [["a"], ["b", "c"]]  # not read again key by key
        table.fails = False
        assert await merged.row("c") == ("c", "C")

    asyncio.run(main())


def test_a_waiter_gone_leaves_the_others_answered() -> None:
    async def main() -> None:
        table = Table("abc")
        merged = MergedReads(table.read)
        table.gate.clear()
        first = asyncio.ensure_future(merged.row("a"))
        await asyncio.sleep(0)
        gone, kept = asyncio.ensure_future(merged.row("b")), asyncio.ensure_future(merged.row("c"))
        await asyncio.sleep(0)
        gone.cancel()
        table.gate.set()
        assert await first == ("a", "A") and await kept == ("c", "C")
        assert gone.cancelled()

    asyncio.run(main())


def test_a_row_answers_only_the_key_it_holds() -> None:
    """A row whose key is not the one asked (a database that cut the key) answers nothing."""

    async def main() -> None:
        async def cut(keys: list[Any]) -> Sequence[Any]:
            return [(k[:3], "row") for k in keys]

        merged = MergedReads(cut)
        assert await merged.row("abc") == ("abc", "row")
        assert await merged.row("abcd") is None

    asyncio.run(main())


def test_a_read_that_never_ends_is_given_up_and_the_next_go_on() -> None:
    async def main() -> None:
        table = Table("abc")
        merged = MergedReads(table.read, timeout_s=0.2)
        table.gate.clear()  # held for good: a connection gone silent
        first = asyncio.ensure_future(merged.row("a"))
        await asyncio.sleep(0)
        then = asyncio.ensure_future(merged.row("b"))
        with pytest.raises(TimeoutError):
            await first
        table.gate.set()
        assert await then == ("b", "B")

    asyncio.run(main())
