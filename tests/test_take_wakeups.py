"""When the take pump pops: no empty POP after every transfer, items pushed straight into the list
still reach a waiter, timers armed early never deliver early, and a transfer waits for the caller
still taking from the prefetch buffer."""

from __future__ import annotations

import asyncio
from typing import Any

from redis.asyncio import Redis

from aiodelayq._consuming.take import _DRAINED_FOR_S
from tests.helpers import open_with_ready, server_ms


async def test_a_stream_of_due_items_makes_no_empty_pop_after_each_transfer(make_queue: Any) -> None:
    q = make_queue(codec="json", safety_poll_s=300)
    n = 40
    async with q:
        pump = q._life.pump()
        await q.offer_many([(i, 0.2 + 0.01 * i) for i in range(n)])  # one due every 10 ms
        got = []
        async for item in q:
            got.append(item)
            if len(got) == n:
                break
        assert got == list(range(n))
        # Each due time: the timer's POP transfers and pops the item; the caller comes back for
        # the next one right after the list was found empty, and waits for the next transfer
        # instead of popping (it used to: one empty POP per item).
        # A loop that lags past the drained window may add an empty POP now and then: allow a
        # quarter; the regression made one per item.
        assert pump.idle_pops <= n // 4, pump


async def test_items_pushed_straight_into_the_list_reach_a_waiter_that_did_not_pop(
        client: Redis, make_queue: Any) -> None:
    q = make_queue(codec="json", safety_poll_s=300)
    async with q:
        pump = q._life.pump()
        assert await q.poll() is None  # a pop that found the list empty
        taker = asyncio.ensure_future(q.take())
        await asyncio.sleep(0)
        assert pump._recheck is not None  # it waits without popping ...
        await client.rpush(q.keys.destination, b"7")  # ... while other code pushes straight into the list
        loop = asyncio.get_running_loop()
        started = loop.time()
        assert await asyncio.wait_for(taker, 2) == 7  # not at the next transfer (300 s away)
        assert loop.time() - started < _DRAINED_FOR_S + 1.0


async def test_timers_armed_early_never_deliver_an_item_before_its_due_time(client: Redis, make_queue: Any) -> None:
    q = make_queue(codec="json", safety_poll_s=300)
    async with q:
        dues = await q.offer_many([(i, 0.1 + 0.007 * i) for i in range(30)])
        for i in range(30):
            assert await asyncio.wait_for(q.take(), 5) == i
            assert await server_ms(client) >= dues[i]  # the server decides what is due
        assert q.stats.moved == 30


async def test_a_transfer_request_waits_for_the_caller_taking_from_the_buffer(client: Redis, make_queue: Any) -> None:
    async with open_with_ready(client, make_queue(codec="json", safety_poll_s=300), 300) as q:
        pump = q._life.pump()
        for _ in range(20):  # until a pop left items in the prefetch buffer
            await q.take()
            if pump._buffer:
                break
        assert pump._buffer
        ask = pump.ask_transfer(100)
        assert ask is not None  # nobody waits, but the caller is still taking from the buffer

        async def rest_then_one_more() -> None:
            while pump._buffer:  # without a yield, as `async for` does
                await q.take()
            await q.take()  # now it waits: its POP transfers first

        await asyncio.wait_for(rest_then_one_more(), 5)
        sent, received, reply = await asyncio.wait_for(ask, 5)
        assert sent <= received
        assert reply is not None
        assert pump.transfers == 1

        for _ in range(20):
            await q.take()
            if pump._buffer:
                break
        assert pump._buffer
        ask = pump.ask_transfer(100)
        assert ask is not None
        # Nobody comes back: the buffer goes back within a round trip, and the request with it
        # (the scheduler then transfers itself).
        assert await asyncio.wait_for(ask, 2) is None
        assert not pump._buffer
