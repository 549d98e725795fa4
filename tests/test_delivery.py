"""Delivery: ordering, scheduling, compensation, re-arming, safety poll, lifecycle."""

from __future__ import annotations

import asyncio
import logging
import math
from typing import Any

import pytest
from redis.asyncio import Redis

from aiodelayq import (
    BackendError,
    ConfigurationError,
    DelayedQueue,
    InvalidDelayError,
    QueueClosedError,
    QueueNotOpenError,
)
from aiodelayq._runtime.client_runtime import runtime_for
from tests.helpers import server_ms, server_past, until


async def test_items_come_out_in_due_order(make_queue: Any) -> None:
    q = make_queue()
    delays = [0.25, 0.05, 0.2, 0.0, 0.15, 0.1]
    await q.offer_many([(d, d) for d in delays])
    async with q:
        got = [await asyncio.wait_for(q.take(), 5) for _ in delays]
    assert got == sorted(delays)


async def test_delivery_is_not_early_and_not_late(client: Redis, make_queue: Any) -> None:
    q = make_queue(safety_poll_s=60)
    async with q:
        due = await q.offer("x", 0.3)
        assert await asyncio.wait_for(q.take(), 5) == "x"
        now = await server_ms(client)
    assert due <= now < due + 1000


async def test_take_needs_an_open_queue(make_queue: Any) -> None:
    q = make_queue()
    with pytest.raises(QueueNotOpenError):
        await q.take()
    with pytest.raises(QueueNotOpenError):
        await q.poll()
    with pytest.raises(QueueNotOpenError):
        q.__aiter__()
    async with q:
        pass
    with pytest.raises(QueueClosedError):
        await q.take()
    with pytest.raises(QueueClosedError):
        await q.open()


async def test_poll(make_queue: Any) -> None:
    q = make_queue()
    async with q:
        assert await q.poll() is None
        assert await q.poll(0) is None
        assert await q.poll(0.05) is None
        await q.offer("x", 0)
        assert await q.poll(5) == "x"
        await q.offer("y", 0)
        await until(q.ready_size)
        assert await q.poll() == "y"
        with pytest.raises(InvalidDelayError):
            await q.poll(-1)
        with pytest.raises(InvalidDelayError):
            await q.poll(math.nan)


async def test_async_for_ends_when_closed(make_queue: Any) -> None:
    q = make_queue()
    await q.offer_many([(i, 0) for i in range(5)])
    got: list[int] = []

    async def consume() -> None:
        async for item in q:
            got.append(item)
            if len(got) == 5:
                asyncio.get_running_loop().create_task(q.aclose())

    async with q:
        await asyncio.wait_for(consume(), 5)
    assert sorted(got) == list(range(5))


async def test_aclose_wakes_waiters_is_idempotent_and_bounded(make_queue: Any) -> None:
    q = make_queue(close_timeout_s=2)
    await q.open()
    waiters = [asyncio.create_task(q.take()) for _ in range(3)]
    await asyncio.sleep(0.05)
    loop = asyncio.get_running_loop()
    start = loop.time()
    await asyncio.gather(q.aclose(), q.aclose())
    assert loop.time() - start < 2.5
    for waiter in waiters:
        with pytest.raises(QueueClosedError):
            await waiter
    await q.aclose()
    assert not q.is_open


async def test_startup_compensation_moves_items_that_fell_due_while_nobody_ran(client: Redis,
                                                                               make_queue: Any) -> None:
    producer = make_queue()
    dues = await producer.offer_many([(i, 0.05) for i in range(20)])
    await until(lambda: server_past(client, max(dues)))
    assert await producer.ready_size() == 0  # nothing moves without a scheduler
    async with make_queue() as consumer:
        assert await consumer.ready_size() == 20  # moved by the transfer that open() runs
        assert sorted([await consumer.take() for _ in range(20)]) == list(range(20))


async def test_earlier_item_from_another_client_re_arms_the_timer(make_client: Any, make_queue: Any) -> None:
    other = make_client()
    q = make_queue(safety_poll_s=300)
    async with q:
        await q.offer("late", 120)
        scheduler = runtime_for(q._client).scheduler(q.name)
        assert scheduler is not None
        loop = asyncio.get_running_loop()
        await until(lambda: scheduler.armed_at - loop.time() > 100)
        await make_queue(redis=other).offer("early", 0.2)
        assert await asyncio.wait_for(q.take(), 5) == "early"


async def test_a_later_wake_up_never_replaces_an_earlier_one(client: Redis, make_queue: Any) -> None:
    q = make_queue(safety_poll_s=300)
    async with q:
        due = await q.offer("soon", 2.0)  # the timer must not fire before the check, on a slow machine too
        scheduler = runtime_for(client).scheduler(q.name)
        assert scheduler is not None
        armed = scheduler.armed_at
        # A (skewed) Redisson producer announces a later head: the earlier timer must stay.
        await client.publish(q.keys.channel, str(due + 60_000))
        await client.publish(q.keys.channel, "not-a-number")
        await asyncio.sleep(0.05)
        assert scheduler.armed_at <= armed
        assert await asyncio.wait_for(q.take(), 10) == "soon"


async def test_safety_poll_recovers_from_a_lost_publish(client: Redis, make_queue: Any) -> None:
    q = make_queue(safety_poll_s=0.3)
    async with q:
        await q.offer("far", 300)
        # Another producer writes an earlier element but its PUBLISH is lost.
        [element] = await client.zrange(q.keys.timeout_set, 0, 0)
        fake = element[:13] + b"\x01" * 8 + element[21:]  # same payload, another random id
        now = await server_ms(client)
        await client.zadd(q.keys.timeout_set, {fake: now})
        assert await asyncio.wait_for(q.take(), 5) == "far"


async def test_keeps_transferring_while_more_than_a_batch_is_due(client: Redis, make_queue: Any) -> None:
    q = make_queue(transfer_batch=10, safety_poll_s=300)
    await q.offer_many([(i, 0) for i in range(250)])
    async with q:
        await until(lambda: _empty(client, q), timeout_s=5)
        assert q.stats.transfers >= 25
        assert await q.ready_size() == 250


async def _empty(client: Redis, q: DelayedQueue[Any]) -> bool:
    return await client.zcard(q.keys.timeout_set) == 0


async def test_one_scheduler_and_one_pubsub_connection_per_client(client: Redis, make_queue: Any,
                                                                  qname: str) -> None:
    name = await client.client_getname()
    assert name is None
    queues = [make_queue(f"{qname}:{i}") for i in range(5)] + [make_queue(f"{qname}:0")]
    for q in queues:
        await q.open()
    runtime = runtime_for(client)
    assert runtime.subscriber.channels == 5
    assert runtime.scheduler(f"{qname}:0") is runtime.scheduler(queues[-1].name)
    mine = [c for c in await client.client_list(_type="pubsub")
            if int(c.get("sub", 0)) == 5]
    assert len(mine) == 1
    await queues[-1].aclose()
    assert runtime.scheduler(f"{qname}:0") is not None  # still used by queues[0]


async def test_open_fails_clearly_when_redis_is_unreachable() -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    client = Redis(host="127.0.0.1", port=port, socket_connect_timeout=0.2)
    q = DelayedQueue(client, "nowhere", open_timeout_s=1)
    loop = asyncio.get_running_loop()
    start = loop.time()
    with pytest.raises(BackendError):
        await q.open()
    assert loop.time() - start < 3.0  # open_timeout_s (1 s) plus a busy machine's lag
    assert not q.is_open
    assert runtime_for(client) is None
    with pytest.raises(BackendError):
        await q.offer("x", 1)
    await q.aclose()
    await client.aclose()


async def test_redis_errors_are_retried_with_backoff_and_logged(own_server: Any, make_client: Any, make_queue: Any,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    client = make_client(own_server())
    q = make_queue("errors", redis=client, safety_poll_s=300)
    async with q:
        await client.config_set("maxmemory", "1")
        await client.config_set("maxmemory-policy", "noeviction")
        with caplog.at_level(logging.WARNING, logger="aiodelayq"), pytest.raises(BackendError):
            await q.offer("x", 0)  # a write under OOM: clear error
        assert await q.size() == 0
        await client.config_set("maxmemory", "0")
        await q.offer("x", 0.1)
        await client.config_set("maxmemory", "1")
        with caplog.at_level(logging.WARNING, logger="aiodelayq"):
            await until(lambda: q.stats.transfer_errors >= 2, timeout_s=5)
        assert "transfer" in caplog.text
        await client.config_set("maxmemory", "0")
        assert await asyncio.wait_for(q.take(), 10) == "x"


async def test_aclose_while_opening_leaves_nothing_running(client: Redis, make_queue: Any) -> None:
    q = make_queue()
    opening = asyncio.create_task(q.open())
    await asyncio.sleep(0)
    await q.aclose()
    with pytest.raises(QueueClosedError):
        await opening
    assert not q.is_open
    assert runtime_for(client) is None


async def test_take_many_returns_what_is_ready_in_one_round_trip(client: Redis, make_queue: Any) -> None:
    q = make_queue()
    await q.offer_many([(i, 0) for i in range(250)])
    async with q:
        got: list[int] = []
        while len(got) < 250:
            batch = await q.take_many(100, timeout=5)
            assert 1 <= len(batch) <= 100
            got.extend(batch)
        assert sorted(got) == list(range(250))
        assert await q.take_many(10, timeout=0.05) == []
        with pytest.raises(ConfigurationError):
            await q.take_many(0)
