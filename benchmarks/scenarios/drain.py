"""Scenario ``drain``: a backlog of due items, consumed one at a time versus in batches."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from _harness import Bench, alternate, fill, ratio, until

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
    await until(lambda: client.zcard(q.keys.in_flight), lambda n: n == 0, 3600.0, 0.001)
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

    async def measure(mode: str) -> float:
        n = s.drain_messages if mode in ("messages_ack", "worker16") else s.drain_items
        async with bench.fresh_queue("drain", mode, clients=2) as (producer, consumer, name):
            await fill(DelayedQueue(producer, name), n, 0)
            async with DelayedQueue(consumer, name) as q:
                await until(q.ready_size, lambda ready: ready >= n, 60)  # all moved first: the drain alone is timed
                return await _drain(q, consumer, mode, n)

    ours = await alternate(MODES, s.rounds, measure, "items_per_s")
    rate = {mode: ours[mode]["items_per_s"] for mode in MODES}
    return {"items": s.drain_items, "messages": s.drain_messages, "ours": ours,
            "ratio": {**{mode: ratio(rate[mode], rate["take_many"]) for mode in MODES[1:]},
                      "worker16_vs_async_for": ratio(rate["worker16"], rate["async_for"])}}
