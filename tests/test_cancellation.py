"""take()/poll() are cancellation-safe: a caller that gives up never loses an item Redis popped."""

from __future__ import annotations

import asyncio
import contextlib
import random
from typing import Any

from redis.asyncio import Redis

from tests.helpers import until


async def _drain(q: Any, expected: int, got: list[int]) -> None:
    while len(got) < expected:
        item = await q.poll(2.0)
        assert item is not None, f"lost items: have {len(got)} of {expected}"
        got.append(item)


async def test_many_tiny_wait_for_timeouts_lose_nothing(client: Redis, make_queue: Any) -> None:
    n = 400
    q = make_queue(safety_poll_s=300)
    async with q:
        await q.offer_many([(i, random.uniform(0, 0.5)) for i in range(n)])
        got: list[int] = []
        rng = random.Random(7)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 15
        timeouts = 0
        while len(got) < n and loop.time() < deadline:
            try:
                got.append(await asyncio.wait_for(q.take(), rng.choice([0, 0.0001, 0.0005, 0.001, 0.003])))
            except asyncio.TimeoutError:
                timeouts += 1
        await _drain(q, n, got)
        assert timeouts > 100  # the race was really exercised
        assert sorted(got) == list(range(n))  # every item exactly once
        assert await q.poll(0.2) is None
        assert await q.ready_size() == 0


async def test_cancelled_tasks_and_nowait_polls_lose_nothing(client: Redis, make_queue: Any) -> None:
    n = 300
    q = make_queue(safety_poll_s=300)
    async with q:
        await q.offer_many([(i, 0) for i in range(n)])
        got: list[int] = []
        rng = random.Random(11)
        for _ in range(600):
            task = asyncio.create_task(q.take() if rng.random() < 0.5 else q.poll())
            for _ in range(rng.randint(0, 3)):
                await asyncio.sleep(0)
            task.cancel()
            try:
                item = await task
            except asyncio.CancelledError:
                continue
            if item is not None:
                got.append(item)
        await _drain(q, n, got)
        assert sorted(got) == list(range(n))


async def test_close_with_waiting_takes_loses_nothing(redis_server: Any, make_queue: Any, qname: str) -> None:
    n = 200
    q = make_queue()
    await q.offer_many([(i, random.uniform(0, 0.3)) for i in range(n)])
    got: list[int] = []

    async def consumer() -> None:
        async for item in q:
            got.append(item)

    await q.open()
    consumers = [asyncio.create_task(consumer()) for _ in range(8)]
    await until(lambda: len(got) >= n // 2, timeout_s=10, interval_s=0.002)
    await q.aclose()
    await asyncio.gather(*consumers)
    async with make_queue() as rest:
        await _drain(rest, n, got)
    assert sorted(got) == list(range(n))


async def test_take_many_under_tiny_timeouts_loses_nothing(client: Redis, make_queue: Any) -> None:
    n = 600
    q = make_queue(safety_poll_s=300)
    async with q:
        await q.offer_many([(i, random.uniform(0, 0.3)) for i in range(n)])
        got: list[int] = []
        rng = random.Random(5)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 15
        while len(got) < n and loop.time() < deadline:
            with contextlib.suppress(asyncio.TimeoutError):
                got.extend(await asyncio.wait_for(q.take_many(rng.randint(1, 9)), rng.choice([0, 0.0003, 0.002])))
        await _drain(q, n, got)
        assert sorted(got) == list(range(n))
