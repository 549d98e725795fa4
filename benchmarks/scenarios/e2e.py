"""Scenario ``e2e``: offer -> due -> consumed, in one process."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from _harness import Bench, paired, payload, stop_reference
from reference import ReferenceQueue, ReferenceSubscriber

from aiodelayq import DelayedQueue


async def run(bench: Bench) -> dict[str, Any]:
    """One process, two clients: a producer offers batches of 1000 items due at once (delay 0) while at
    most ``e2e_backlog`` are offered but not yet consumed; a consumer takes them (ours: ``take_many(1000)``
    on an opened queue; reference: its transfer scheduler plus a ``BLPOP`` loop). msgs/s = items
    consumed during ``e2e_seconds`` / ``e2e_seconds``."""
    s = bench.sizes
    return {"seconds": s.e2e_seconds, "backlog_cap": s.e2e_backlog,
            **await paired(bench, lambda impl: _e2e(bench, impl), "msgs_per_s")}


async def _e2e(bench: Bench, impl: str) -> float:
    s = bench.sizes
    name = bench.name("e2e", impl)
    producer, consumer = bench.client(), bench.client()
    offered = consumed = 0
    stop = False
    sub = ref_c = None
    cq: DelayedQueue[Any] = DelayedQueue(consumer, name)
    try:
        if impl == "ours":
            await cq.open()
            send: Callable[[Any], Awaitable[list[int]]] = DelayedQueue(producer, name).offer_many

            async def take() -> int:
                return len(await cq.take_many(1000, timeout=0.2))
        else:
            ref_p = await ReferenceQueue(producer, name).prepare()
            ref_c = rc = await ReferenceQueue(consumer, name).prepare(ref_p.shas)
            sub = ReferenceSubscriber(consumer)
            ref_c.start(sub)
            await sub.start()
            send = ref_p.offer_pipeline

            async def take() -> int:
                return 0 if await rc.take(0.2) is None else 1

        async def produce() -> None:
            nonlocal offered
            while not stop:
                if offered - consumed >= s.e2e_backlog:
                    await asyncio.sleep(0.001)
                    continue
                await send([(payload(j), 0) for j in range(offered, offered + 1000)])
                offered += 1000

        async def consume() -> None:
            nonlocal consumed
            while not stop:
                got = await take()
                if not stop:
                    consumed += got

        tasks = [asyncio.ensure_future(produce()), asyncio.ensure_future(consume())]
        t0 = time.perf_counter()
        await asyncio.sleep(s.e2e_seconds)
        rate = consumed / (time.perf_counter() - t0)
        stop = True
        done, pending = await asyncio.wait(tasks, timeout=10.0)
        for task in pending:
            task.cancel()
        for task in done:
            if task.exception() is not None:
                raise RuntimeError("e2e task failed") from task.exception()
        return rate
    finally:
        await cq.aclose()
        await stop_reference(ref_c, sub)
        await producer.aclose()
        await consumer.aclose()
        await bench.drop(name)
