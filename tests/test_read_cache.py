"""Answers of GET /runs/{id} kept between writes: this process's writes are seen at once,
another process's within ``read_cache_s``; concurrent misses share one read; a read never
serves a request that came after a write it began before."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from service.api import read_cache
from service.api.read_cache import Answer, OneRun, ReadCache
from service.app import create_app
from service.errors import NotFound
from service.store import runs
from service.store.changes import Changes
from service.store.db import Database, upgrade
from service.store.prepared import fetch
from service.store.runs import run_page
from tests.conftest import make_settings, submit
from tests.factories import add_run, rename_run


def test_this_replicas_writes_are_seen_at_once(db_url: str) -> None:
    settings = make_settings(db_url, "http://127.0.0.1:9", run_loops=False, read_cache_s=60)
    with TestClient(create_app(settings)) as client:
        run_id = submit(client)
        assert client.get(f"/runs/{run_id}").json()["status"] == "QUEUED"
        assert client.post(f"/runs/{run_id}/cancel").status_code == 200
        assert client.get(f"/runs/{run_id}").json()["status"] == "CANCELLED"
        # A write by anything else in this process (here: the app's own database) as well.
        rename_run(client.app.state.services.db, run_id, "renamed")  # type: ignore[attr-defined]
        assert client.get(f"/runs/{run_id}").json()["name"] == "renamed"


@pytest.mark.parametrize("ttl", [0.0, 2.0])
def test_another_replicas_write_is_seen_within_the_bound(db_url: str, ttl: float) -> None:
    settings = make_settings(db_url, "http://127.0.0.1:9", run_loops=False, read_cache_s=ttl)
    upgrade(db_url)
    # Another process whose writes tell no one (no change feed: as on SQLite, or a notification
    # lost): only the bound makes them seen. (2 s: longer than the steps below on a slow machine.)
    other = Database(db_url)
    try:
        with TestClient(create_app(settings)) as client:
            run_id = submit(client, name="before")
            assert client.get(f"/runs/{run_id}").json()["name"] == "before"
            rename_run(other, run_id, "after")
            seen = client.get(f"/runs/{run_id}").json()["name"]
            # Kept: still the answer read before; not kept (0): read again.
            assert seen == ("before" if ttl else "after")
            time.sleep(ttl)
            assert client.get(f"/runs/{run_id}").json()["name"] == "after"
    finally:
        other.dispose()


def test_a_poller_that_sends_back_the_etag_gets_304_until_the_run_changes(db_url: str) -> None:
    settings = make_settings(db_url, "http://127.0.0.1:9", run_loops=False)
    with TestClient(create_app(settings)) as client:
        run_id = submit(client)
        first = client.get(f"/runs/{run_id}")
        etag = first.headers["etag"]
        assert first.headers["cache-control"] == "no-cache"
        same = client.get(f"/runs/{run_id}", headers={"If-None-Match": etag})
        assert same.status_code == 304 and same.content == b"" and same.headers["etag"] == etag
        # A weak form of the tag, in a list, matches; another tag does not.
        listed = client.get(f"/runs/{run_id}", headers={"If-None-Match": f'"x", W/{etag}'})
        assert listed.status_code == 304
        assert client.get(f"/runs/{run_id}", headers={"If-None-Match": '"x"'}).status_code == 200
        client.post(f"/runs/{run_id}/cancel")
        changed = client.get(f"/runs/{run_id}", headers={"If-None-Match": etag})
        assert changed.status_code == 200 and changed.json()["status"] == "CANCELLED"
        assert changed.headers["etag"] != etag
        # A page of runs the same way.
        held = {"If-None-Match": client.get("/runs").headers["etag"]}
        assert client.get("/runs", headers=held).status_code == 304
        submit(client)
        assert client.get("/runs", headers=held).status_code == 200


ONE = OneRun("k")


class Reads:
    """A read that counts its calls and waits for ``gate`` (set: no wait) on a worker thread."""

    def __init__(self, body: bytes = b"{}") -> None:
        self.calls = 0
        self.gate = threading.Event()
        self.gate.set()
        self.body = body

    async def __call__(self) -> Answer:
        self.calls += 1
        assert await asyncio.to_thread(self.gate.wait, 10)
        return Answer(self.body, "team")

    async def held(self, cache: ReadCache, key: str) -> asyncio.Task[Answer]:
        """A read of ``key`` through ``cache``, begun and held at the gate until it is set."""
        self.gate.clear()
        under_way = asyncio.create_task(cache.answer(key, ONE, self))
        await asyncio.sleep(0.05)
        return under_way

    async def across(self, cache: ReadCache, key: str, write: Callable[[], object]) -> None:
        """A read of ``key`` through ``cache`` while ``write`` is done."""
        under_way = await self.held(cache, key)
        write()
        self.gate.set()
        await under_way


@pytest.fixture
def database(tmp_path: Any) -> Any:
    url = f"sqlite:///{tmp_path}/db.sqlite"
    upgrade(url)
    db = Database(url)
    yield db
    db.dispose()


def test_concurrent_misses_share_one_read_and_later_hits_read_nothing(database: Database) -> None:
    cache, read = ReadCache(database, ttl_s=60), Reads()

    async def main() -> list[Answer]:
        read.gate.clear()
        waiting = [asyncio.create_task(cache.answer("k", ONE, read)) for _ in range(300)]
        await asyncio.sleep(0.05)
        read.gate.set()
        return [*await asyncio.gather(*waiting), await cache.answer("k", ONE, read)]

    answers = asyncio.run(main())
    assert read.calls == 1
    assert {a.body for a in answers} == {b"{}"}


def test_a_request_after_a_write_does_not_join_a_read_that_began_before(
    database: Database,
) -> None:
    cache, read = ReadCache(database, ttl_s=60), Reads()
    add_run(database, "k")
    add_run(database, "other")

    async def main() -> None:
        before = await read.held(cache, "k")
        rename_run(database, "k", "new")  # a committed write: the read under way may not see it
        after = await read.held(cache, "k")
        read.gate.set()
        await asyncio.gather(before, after)
        assert read.calls == 2  # the second request read on its own
        # The second read was kept (it began after the write): a hit.
        await cache.answer("k", ONE, read)
        assert read.calls == 2
        # A write to another run leaves a read under way good to join.
        rename_run(database, "k", "newer")
        first = await read.held(cache, "k")
        rename_run(database, "other", "new")
        joined = await read.held(cache, "k")
        read.gate.set()
        await asyncio.gather(first, joined)
        assert read.calls == 3

    asyncio.run(main())


def test_a_failed_read_fails_its_waiters_and_is_not_kept(database: Database) -> None:
    cache = ReadCache(database, ttl_s=60)
    calls = 0

    async def missing() -> Answer:
        nonlocal calls
        calls += 1
        await asyncio.sleep(0.01)  # a read under way: the others wait for it
        raise NotFound("no run 'x'")

    async def main() -> None:
        for _ in range(2):
            results = await asyncio.gather(
                *(cache.answer("x", OneRun("x"), missing) for _ in range(20)),
                return_exceptions=True,
            )
            assert all(isinstance(r, NotFound) for r in results)

    asyncio.run(main())
    assert calls == 2


def test_the_cache_keeps_at_most_its_bytes_letting_the_oldest_go(database: Database) -> None:
    cache, read = ReadCache(database, ttl_s=60, max_bytes=30), Reads(b"x" * 10)

    async def main() -> None:
        for key in ("a", "b", "c", "d"):
            await cache.answer(key, OneRun(key), read)
        assert read.calls == 4
        for key in ("b", "c", "d"):  # kept: 30 bytes
            await cache.answer(key, OneRun(key), read)
        assert read.calls == 4
        await cache.answer("a", OneRun("a"), read)  # the oldest was let go
        assert read.calls == 5
        huge = Reads(b"x" * 31)  # more than the whole budget: never kept
        await cache.answer("huge", OneRun("huge"), huge)
        await cache.answer("huge", OneRun("huge"), huge)
        assert huge.calls == 2
        await cache.answer("a", OneRun("a"), read)  # and it pushed nothing out
        assert read.calls == 5

    asyncio.run(main())


def test_an_answer_read_while_its_run_was_written_is_not_kept(database: Database) -> None:
    cache, read = ReadCache(database, ttl_s=60), Reads()
    add_run(database, "k")
    add_run(database, "other")

    async def main() -> None:
        # Another run written: the answer under way stays good.
        await read.across(cache, "k", lambda: rename_run(database, "other", "new"))
        await cache.answer("k", ONE, read)
        assert read.calls == 1
        # Its own run written: it may not have seen the write.
        await read.across(cache, "k again", lambda: rename_run(database, "k", "new"))
        await cache.answer("k again", ONE, read)
        assert read.calls == 3

    asyncio.run(main())


def test_a_read_that_outlived_the_writes_remembered_is_not_kept(
    database: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(read_cache, "_REMEMBERED", 2)
    cache, read = ReadCache(database, ttl_s=60), Reads()
    for run_id in ("a", "b", "c"):
        add_run(database, run_id)

    async def main() -> None:
        under_way = await read.held(cache, "k")
        for run_id in ("a", "b", "c"):  # none is "k", but the first is forgotten
            rename_run(database, run_id, "new")
        read.gate.set()
        await under_way
        await cache.answer("k", ONE, read)

    asyncio.run(main())
    assert read.calls == 2


def test_a_read_looks_only_at_the_writes_since_it_began(database: Database) -> None:
    """A miss costs its rows, not a walk over every write remembered (1,024 in a busy service):
    the writes looked at, newest first, stop at the first one older than the read."""
    cache, read = ReadCache(database, ttl_s=60), Reads()
    looked: list[int] = []

    class Remembered(deque[tuple[int, Changes]]):
        def __reversed__(self) -> Iterator[tuple[int, Changes]]:
            for write in super().__reversed__():
                looked.append(write[0])
                yield write

    cache._recent = Remembered(maxlen=read_cache._REMEMBERED)
    for n in range(50):  # remembered, all before the reads below began
        add_run(database, f"old-{n}")
    assert len(cache._recent) == 50

    async def main() -> None:
        await cache.answer("k", ONE, read)
        assert looked == [50]  # the newest only: it is older than the read
        looked.clear()
        await read.across(cache, "k again", lambda: rename_run(database, "old-0", "new"))
        assert looked == [51, 50]  # the write since the read began, then where to stop

    asyncio.run(main())
    assert read.calls == 2


def test_on_sqlite_a_miss_is_read_on_the_event_loop_on_a_connection_of_its_own(
    tmp_path: Any,
) -> None:
    url = f"sqlite:///{tmp_path}/db.sqlite"
    upgrade(url)
    # One pooled connection, held by another thread for the whole test: a read that needed the
    # pool would wait for it (and fail after wait_s).
    database = Database(url, wait_s=2, pool_size=1, max_overflow=0)
    assert database.reads_on_loop
    add_run(database, "k", name="on the loop")
    cache = ReadCache(database, ttl_s=60)
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with database.read_rows():
            held.set()
            release.wait(10)

    holder = threading.Thread(target=hold)
    holder.start()
    threads: list[int] = []

    def read() -> Answer:
        threads.append(threading.get_ident())
        with database.read_rows() as conn:
            name = fetch(conn, runs._PAGE_RUN, {"run_id": "k"})[0].name
        return Answer(name.encode(), "team")

    async def main() -> tuple[Answer, float]:
        started = time.monotonic()
        answer = await cache.answer("k", ONE, lambda: database.run_read(read))
        return answer, time.monotonic() - started

    try:
        assert held.wait(10)
        answer, took = asyncio.run(main())
    finally:
        release.set()
        holder.join()
        database.dispose()
    assert answer.body == b"on the loop"
    assert took < 1.0  # not the pool's 2 s wait
    assert threads == [threading.get_ident()]  # asyncio.run's loop runs on this thread


def test_where_each_database_reads_a_run(db_url: str) -> None:
    upgrade(db_url)
    database = Database(db_url)
    add_run(database, "k", name="read")

    async def main() -> tuple[int, list[str]]:
        try:
            thread = await database.run_read(threading.get_ident)
            page = await run_page(database, "k")
            return thread, [page[0].name]
        finally:
            await database.dispose_async()

    try:
        thread, names = asyncio.run(main())
    finally:
        database.dispose()
    on_loop = db_url.startswith("sqlite")
    assert database.reads_on_loop is on_loop
    assert (thread == threading.get_ident()) is on_loop
    assert names == ["read"]
