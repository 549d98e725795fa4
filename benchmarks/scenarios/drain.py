"""Scenario ``drain``: a backlog of due items, consumed one at a time versus in batches."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from _harness import Bench, log, median, payload
from redis.asyncio import Redis

from aiodelayq import DelayedQueue


async def _fill(client: Any, name: str, n: int) -> None:
    producer: DelayedQueue[Any] = DelayedQueue(client, name)
    for start in range(0, n, 1000):
        await producer.offer_many([(payload(i), 0) for i in range(start, min(n, start + 1000))])


async def _drain(q: DelayedQueue[Any], client: Redis, mode: str, n: int) -> float:
    got = 0
    t0 = time.perf_counter()
    if mode == "take_many":
        while got < n:
            got += len(await q.take_many(100))
    elif mode == "async_for":
        async for _ in q:
            got += 1
            if got >= n:
                break
    elif mode == "worker16":
        finished = asyncio.Event()

        async def handler(_item: Any) -> None:  # a no-op handler: the worker's own cost
            nonlocal got
            got += 1
            if got >= n:
                finished.set()

        worker = q.worker(handler, concurrency=16)
        running = asyncio.create_task(worker.run())
        await finished.wait()
        worker.stop()
        await running
        while await client.zcard(q.keys.in_flight):  # noqa: ASYNC110 - acks written behind, as below
            await asyncio.sleep(0.001)
    else:
        async for message in q.messages(30.0):
            await message.ack()
            got += 1
            if got >= n:
                break
        # Acks are written behind: the drain ends when the last of them is in Redis.
        while await client.zcard(q.keys.in_flight):  # noqa: ASYNC110
            await asyncio.sleep(0.001)
    return n / (time.perf_counter() - t0)


async def run(bench: Bench) -> dict[str, Any]:
    """``drain_items`` items are due before the consumer starts (filled with ``offer_many``, moved to
    the destination list by the queue's own transfer, then timed from the first take). Three consumers,
    in one process, alternating, ``rounds`` times: ``take_many(100)`` in a loop (the reference, and
    what the batch calls reach), ``async for item in q`` (one item per iteration) and a sequential
    ``async for msg in q.messages(30): await msg.ack()`` loop (reliable; ``drain_messages`` items;
    timed until the last ack is in Redis), and the worker (``q.worker(no-op handler,
    concurrency=16).run()``: reliable, a task per message, acks; ``drain_messages`` items, timed the
    same way). Items/s; ratios against ``take_many(100)``, and the worker's against ``async for``
    (the issue's bar: >= 0.7)."""
    s = bench.sizes
    rates: dict[str, list[float]] = {"take_many": [], "async_for": [], "messages_ack": [], "worker16": []}
    for rnd in range(s.rounds):
        for mode in rates:
            n = s.drain_messages if mode in ("messages_ack", "worker16") else s.drain_items
            async with bench.fresh_queue("drain", mode) as (client, name):
                await _fill(client, name, n)
                consumer = bench.client()
                try:
                    q: DelayedQueue[Any] = DelayedQueue(consumer, name)
                    async with q:
                        # Every item moved first, so the drain alone is timed (a server-side count:
                        # nothing to wait on but a bounded poll).
                        deadline = time.monotonic() + 60
                        while await q.ready_size() < n and time.monotonic() < deadline:  # noqa: ASYNC110
                            await asyncio.sleep(0.01)
                        rate = await _drain(q, consumer, mode, n)
                finally:
                    await consumer.aclose()
            rates[mode].append(rate)
            log(f"    round {rnd + 1} {mode:12}: {n:,} items = {rate:,.0f} items/s")
    med = {mode: median(values) for mode, values in rates.items()}
    base = med["take_many"]
    return {"items": s.drain_items, "messages": s.drain_messages,
            "ours": {mode: {"items_per_s": med[mode], "rounds": rates[mode]} for mode in rates},
            "ratio": {**{mode: (med[mode] / base if med[mode] and base else None)
                         for mode in ("async_for", "messages_ack", "worker16")},
                      "worker16_vs_async_for": (med["worker16"] / med["async_for"]
                                                if med["worker16"] and med["async_for"] else None)}}
