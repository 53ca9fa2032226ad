"""The load-shedding gate (``service/api/overload.py``) on its own: arrival order, a place never
lost to a wait that runs out or a client that leaves, and a limit that shrinks while answers
are slow and grows back once they are fast. The service under a crowd: tests/test_load.py."""

from __future__ import annotations

import asyncio
import time

import pytest

from service.api.overload import LAG_S, Gate


def test_waiters_get_in_in_arrival_order_as_places_free() -> None:
    async def scenario() -> list[int]:
        gate = Gate(most=2, slow_s=1.0)
        assert await gate.enter(0.1) and await gate.enter(0.1)
        order: list[int] = []

        async def wait(i: int) -> None:
            assert await gate.enter(5.0)
            order.append(i)

        tasks = [asyncio.create_task(wait(i)) for i in range(3)]
        await asyncio.sleep(0.01)
        assert order == [] and gate.inside == 2
        for _ in range(3):
            gate.leave(0.01)
            await asyncio.sleep(0.01)
        await asyncio.gather(*tasks)
        assert gate.inside == 2
        return order

    assert asyncio.run(scenario()) == [0, 1, 2]


def test_a_wait_that_runs_out_or_a_client_that_leaves_holds_no_place() -> None:
    async def scenario() -> None:
        gate = Gate(most=1, slow_s=1.0)
        assert await gate.enter(0.1)
        assert not await gate.enter(0.05)  # timed out
        leaving = asyncio.create_task(gate.enter(5.0))
        await asyncio.sleep(0.01)
        leaving.cancel()
        with pytest.raises(asyncio.CancelledError):
            await leaving
        gate.leave(0.01)
        assert gate.inside == 0
        assert await gate.enter(0.1) and gate.inside == 1

    asyncio.run(scenario())


def test_slow_answers_let_fewer_in_and_fast_ones_more_again() -> None:
    async def slow(gate: Gate, answers: int) -> None:
        for _ in range(answers):
            assert await gate.enter(0.1)
            gate.leave(gate.slow_s * 2)

    async def scenario() -> None:
        gate = Gate(most=64, slow_s=0.02)
        assert gate.limit == 16  # a slow start
        # A burst of slow answers cuts once: they were let in under the old limit.
        await slow(gate, 10)
        assert gate.limit == 12
        for _ in range(30):
            await asyncio.sleep(0.03)
            await slow(gate, 1)
        assert gate.limit == gate.least == 4
        # Four in: a fifth waits, and is refused when its wait runs out.
        for _ in range(4):
            assert await gate.enter(0.1)
        assert not await gate.enter(0.05)
        for _ in range(4):
            gate.leave(0.0)
        # Fast answers: one more place per `limit` answers, up to `most`.
        for _ in range(200):
            assert await gate.enter(0.1)
            gate.leave(0.0)
        assert 19 < gate.limit < 21  # sqrt(4**2 + 2 * 200)
        for _ in range(5000):
            assert await gate.enter(0.1)
            gate.leave(0.0)
        assert gate.limit == 64

    asyncio.run(scenario())


def test_an_event_loop_that_lags_lets_fewer_in_and_no_more_until_it_keeps_time() -> None:
    async def scenario() -> None:
        gate = Gate(most=64, slow_s=0.01)
        for _ in range(12):
            time.sleep(0.15)  # the loop's thread is held: every timer runs late
            await asyncio.sleep(0.01)
        assert gate.lag_s > LAG_S and gate.limit < 8, (gate.lag_s, gate.limit)
        lagging = gate.limit
        assert await gate.enter(0.1)
        gate.leave(0.0)  # a fast answer, but the loop lags: no more let in
        assert gate.limit <= lagging
        await asyncio.sleep(1.0)  # the loop keeps time again
        assert gate.lag_s < LAG_S / 2
        assert await gate.enter(0.1)
        gate.leave(0.0)
        assert gate.limit > lagging

    asyncio.run(scenario())
