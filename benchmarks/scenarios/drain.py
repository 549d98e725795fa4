"""Scenario ``drain``: a backlog of due items, consumed one at a time versus in batches."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from _harness import Bench, log, median, payload, ratio

from aiodelayq import DelayedQueue

MODES = ("take_many", "async_for", "messages_ack", "worker16")


async def _drain(q: DelayedQueue[Any], client: Any, mode: str, n: int) -> float:
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
    else:
        async for message in q.messages(30.0):
            await message.ack()
            got += 1
            if got >= n:
                break
    # Acks are written behind: a reliable drain ends when the last of them is in Redis.
    while await client.zcard(q.keys.in_flight):  # noqa: ASYNC110 - a server-side count, bounded by the acks
        await asyncio.sleep(0.001)
    return n / (time.perf_counter() - t0)


async def run(bench: Bench) -> dict[str, Any]:
    """``drain_items`` items due before the consumer starts (filled with ``offer_many``, moved to the
    destination list by the queue's own transfer, then timed from the first take), in one process,
    the consumers alternating, ``rounds`` times: ``take_many(100)`` in a loop (the batch speed to
    reach), ``async for item in q`` (one item per iteration), a sequential ``async for msg in
    q.messages(30): await msg.ack()`` loop and the worker (``q.worker(no-op handler,
    concurrency=16).run()``: reliable, a task per message); the last two on ``drain_messages`` items,
    timed until the last ack is in Redis. Items/s; ratios against ``take_many(100)``, and the worker's
    against ``async for``."""
    s = bench.sizes
    rates: dict[str, list[float]] = {mode: [] for mode in MODES}
    for rnd in range(s.rounds):
        for mode in MODES:
            n = s.drain_messages if mode in ("messages_ack", "worker16") else s.drain_items
            async with bench.fresh_queue("drain", mode) as (client, name):
                producer: DelayedQueue[Any] = DelayedQueue(client, name)
                for start in range(0, n, 1000):
                    await producer.offer_many([(payload(i), 0) for i in range(start, min(n, start + 1000))])
                consumer = bench.client()
                try:
                    q: DelayedQueue[Any] = DelayedQueue(consumer, name)
                    async with q:
                        deadline = time.monotonic() + 60  # every item moved first, so the drain alone is timed
                        while await q.ready_size() < n and time.monotonic() < deadline:  # noqa: ASYNC110
                            await asyncio.sleep(0.01)
                        rates[mode].append(await _drain(q, consumer, mode, n))
                finally:
                    await consumer.aclose()
            log(f"    round {rnd + 1} {mode:12}: {n:,} items = {rates[mode][-1]:,.0f} items/s")
    med = {mode: median(values) for mode, values in rates.items()}
    return {"items": s.drain_items, "messages": s.drain_messages,
            "ours": {mode: {"items_per_s": med[mode], "rounds": rates[mode]} for mode in MODES},
            "ratio": {**{mode: ratio(med[mode], med["take_many"]) for mode in MODES[1:]},
                      "worker16_vs_async_for": ratio(med["worker16"], med["async_for"])}}
