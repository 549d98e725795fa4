"""The take pump's prefetch: one item at a time at batch speed, without holding items nobody waits for."""

from __future__ import annotations

import asyncio
from typing import Any

from redis.asyncio import Redis

from aiodelayq._consuming.prefetch import MAX_PREFETCH
from tests.helpers import llen_is, open_with_ready, until


async def _take(q: Any, count: int) -> list[int]:
    """``count`` items, one ``take()`` at a time (the prefetch grows meanwhile)."""
    return [await asyncio.wait_for(q.take(), 5) for _ in range(count)]


async def test_one_at_a_time_takes_are_served_from_a_prefetch_in_order(client: Redis, make_queue: Any) -> None:
    n = 3 * MAX_PREFETCH
    async with open_with_ready(client, make_queue(codec="json"), n) as q:
        got = await _take(q, n)
        assert got == list(range(n))  # list order, one by one, none twice
        # One round trip per item would be n pops; the prefetch grows to 100 per pop (it may halve
        # when the machine stalls a take past the hold, so the bound leaves room for that).
        assert q._life.pump().pops <= n // 4
        assert await client.llen(q.keys.destination) == 0
        # The last pop's hand-off entry is forgotten by the next POP, or by FINISH within a round trip.
        await until(lambda: _handoff_empty(client, q), timeout_s=1)


async def test_prefetched_items_nobody_takes_go_back_within_a_round_trip(client: Redis, make_queue: Any) -> None:
    n = 200
    async with open_with_ready(client, make_queue(codec="json"), n) as q:
        taken = await _take(q, 20)
        pump = q._life.pump()
        # Pops of 1, 2, 4, 8, 16 items served 20 takes: about 11 were prefetched for nobody. Within a
        # round trip (at most 50 ms) every item not taken is back at the head of the list, in order,
        # and the hand-off entries are finished: nothing is held for a caller that does not come.
        await until(lambda: llen_is(client, q, n - len(taken)), timeout_s=1)
        await until(lambda: _handoff_empty(client, q), timeout_s=1)
        assert not pump._buffer
        assert pump.returned >= 1
        rest = await client.lrange(q.keys.destination, 0, -1)
        assert [int(x) for x in rest] == list(range(len(taken), n))
        assert taken == list(range(len(taken)))
        # Another consumer gets them.
        assert await asyncio.wait_for(q.take(), 5) == len(taken)


async def _handoff_empty(client: Redis, q: Any) -> bool:
    return int(await client.hlen(q.keys.handoff)) == 0


async def test_close_with_a_full_prefetch_buffer_loses_nothing(client: Redis, make_queue: Any) -> None:
    n = 300
    async with open_with_ready(client, make_queue(codec="json", safety_poll_s=300), n) as q:
        taken = await _take(q, 40)
    # Closed at once, items perhaps still prefetched: all of them are back in the list, none twice.
    rest = [int(x) for x in await client.lrange(q.keys.destination, 0, -1)]
    assert sorted(taken + rest) == list(range(n))
    assert await client.hlen(q.keys.handoff) == 0


async def test_concurrent_takers_keep_their_order_with_a_prefetch(client: Redis, make_queue: Any) -> None:
    n = 100
    async with open_with_ready(client, make_queue(codec="json"), n) as q:
        first = await _take(q, 10)
        # Five takers that start waiting in order get items in that order.
        results = await asyncio.gather(*(asyncio.wait_for(q.take(), 5) for _ in range(5)))
        assert results == sorted(results)
        assert first + results == list(range(15))


async def test_a_waiting_taker_gets_due_items_in_the_pop_that_transfers_them(client: Redis, make_queue: Any) -> None:
    q = make_queue(codec="json", safety_poll_s=300)
    async with q:
        pump = q._life.pump()
        for i in range(5):
            taker = asyncio.ensure_future(q.take())
            await q.offer(i, 0.05)
            assert await asyncio.wait_for(taker, 5) == i
        # The scheduler's timer found a waiting taker each time: its POP moved the item and popped it.
        assert pump.transfers >= 4
        assert q.stats.moved == 5
        await until(lambda: _handoff_empty(client, q), timeout_s=1)


async def test_a_pop_that_transferred_and_lost_its_reply_delivers_once(
        own_server: Any, make_proxy: Any, make_client: Any, make_queue: Any) -> None:
    from aiodelayq._scripts import POP

    proxy = make_proxy(own_server())
    q = make_queue("lost-tp", redis=make_client(proxy), codec="json", safety_poll_s=300)
    async with q:
        await q.offer("warm", 0)
        assert await asyncio.wait_for(q.take(), 5) == "warm"  # POP loaded
        for i in range(3):
            taker = asyncio.ensure_future(q.take())
            await asyncio.sleep(0.05)  # the taker waits
            proxy.kill_after_send(POP.sha.encode())  # the transferring POP is applied, its reply lost
            await q.offer(i, 0.1)
            assert await asyncio.wait_for(taker, 10) == i  # the resend returns the same item
        assert await q.poll(0.5) is None  # nothing twice
        assert proxy.killed == 3
