"""The reliable consumer at batch speed: prefetched receives, and acks written behind in batches."""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta
from typing import Any

import pytest
from redis.asyncio import Redis

from aiodelayq import DelayedQueue
from aiodelayq._consuming.prefetch import MAX_PREFETCH
from tests.helpers import llen_is, open_with_ready, until


async def test_messages_and_acks_one_at_a_time_share_round_trips(client: Redis, make_queue: Any) -> None:
    n = 3 * MAX_PREFETCH
    q = make_queue(codec="json")
    async with open_with_ready(client, q, n):
        got = []
        async for msg in q.messages(visibility_timeout=timedelta(seconds=30)):
            got.append(msg.value)
            assert msg.delivery_count == 1
            assert await msg.ack()  # written behind: known to apply, not waited for
            if len(got) == n:
                break
        consumer = q._life.reliable()
        assert got == list(range(n))  # list order, one by one, none twice
        # One round trip per message would be n receives and n settles; the prefetch grows to 100
        # per receive (it may halve if the machine stalls a receive past the hold).
        assert consumer.receives <= n // 4
        assert consumer.settler.calls <= n // 4
        await until(lambda: _in_flight_is(client, q, 0), timeout_s=5)
    assert q.stats.unconfirmed_settles == 0
    assert await client.llen(q.keys.destination) == 0


async def _in_flight_is(client: Redis, q: Any, n: int) -> bool:
    return int(await client.zcard(q.keys.in_flight)) == n


async def test_close_sends_the_acks_written_behind(client: Redis, make_queue: Any) -> None:
    n = 150
    q = make_queue(codec="json", safety_poll_s=300)
    async with open_with_ready(client, q, n):
        msgs = await q.receive_many(n, visibility_timeout=30, timeout=5)
        assert len(msgs) == n
        for msg in msgs:
            assert await msg.ack()
        # No await since the acks: nothing has been sent yet; closing must send them.
    assert await client.zcard(q.keys.in_flight) == 0
    assert q.stats.unconfirmed_settles == 0


async def test_prefetched_messages_nobody_receives_are_released_within_a_round_trip(
        client: Redis, make_queue: Any) -> None:
    n = 200
    q = make_queue(codec="json")
    async with open_with_ready(client, q, n):
        received = [await q.receive(visibility_timeout=30, timeout=5) for _ in range(20)]
        values = [m.value for m in received if m is not None]
        assert values == list(range(20))
        # Receives of 1, 2, 4, 8, 16 messages served 20 receivers: about 11 were prefetched for
        # nobody. Within a round trip (at most 50 ms) they are released: back at the head of the
        # list in order, out of flight, their delivery not counted.
        await until(lambda: llen_is(client, q, n - 20), timeout_s=1)
        assert await client.zcard(q.keys.in_flight) == 20
        consumer = q._life.reliable()
        assert consumer.released >= 1
        assert not consumer._buffer
        rest = await client.lrange(q.keys.destination, 0, -1)
        assert [int(x) for x in rest] == list(range(20, n))
        again = await q.receive(visibility_timeout=30, timeout=5)
        assert again is not None
        assert (again.value, again.delivery_count) == (20, 1)


async def test_close_with_prefetched_messages_loses_nothing(client: Redis, make_queue: Any) -> None:
    n = 300
    q = make_queue(codec="json", safety_poll_s=300)
    async with open_with_ready(client, q, n):
        received = [await q.receive(visibility_timeout=30, timeout=5) for _ in range(40)]
    # Closed at once, messages perhaps still prefetched: all released, the received ones in flight.
    rest = [int(x) for x in await client.lrange(q.keys.destination, 0, -1)]
    assert sorted([m.value for m in received if m is not None] + rest) == list(range(n))
    assert await client.zcard(q.keys.in_flight) == 40


async def test_an_ack_near_its_deadline_waits_for_the_answer(client: Redis, make_queue: Any) -> None:
    q = make_queue(codec="json", call_timeout_s=5.0)
    async with open_with_ready(client, q, 1):
        msg = await q.receive(visibility_timeout=3, timeout=5)  # less than call_timeout_s left
        assert msg is not None
        assert await msg.ack()
        assert await client.zcard(q.keys.in_flight) == 0  # confirmed before ack() returned
        assert not await msg.ack()


async def test_an_ack_that_cannot_be_written_is_reported_and_the_message_comes_back(
        own_server: Any, make_proxy: Any, make_client: Any, make_queue: Any,
        caplog: pytest.LogCaptureFixture) -> None:
    server = own_server()
    proxy = make_proxy(server)
    client, direct = make_client(proxy), make_client(server)
    q: DelayedQueue[str] = make_queue("wb", redis=client, codec="str", call_timeout_s=0.5)
    other: DelayedQueue[str] = make_queue("wb", redis=direct, codec="str")
    async with q, other:
        await q.offer("job", 0)
        msg = await q.receive(visibility_timeout=1.5, timeout=5)
        assert msg is not None
        proxy.pause()  # Redis unreachable for longer than call_timeout_s
        with caplog.at_level(logging.WARNING, logger="aiodelayq"):
            assert await msg.ack()  # written behind: returns at once
            await until(lambda: q.stats.unconfirmed_settles == 1, timeout_s=5)
        assert any("not confirmed" in r.getMessage() for r in caplog.records)
        proxy.resume()
        again = await other.receive(visibility_timeout=30, timeout=5)  # after msg's deadline
        assert again is not None
        assert (again.value, again.id, again.delivery_count) == ("job", msg.id, 2)
        assert await again.ack(confirm=True)


async def test_concurrent_confirmed_acks_share_a_call(client: Redis, make_queue: Any) -> None:
    n = 50
    q = make_queue(codec="json")
    async with open_with_ready(client, q, n):
        msgs = await q.receive_many(n, visibility_timeout=30, timeout=5)
        settler = q._life.reliable().settler
        calls = settler.calls
        assert all(await asyncio.gather(*(m.ack(confirm=True) for m in msgs)))
        assert settler.calls - calls <= 2  # the first call alone, then the rest together
        assert await client.zcard(q.keys.in_flight) == 0
