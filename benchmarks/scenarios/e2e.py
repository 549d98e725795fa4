"""Scenario ``e2e``: offer -> due -> consumed, in one process."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from _harness import Bench, log, median, payload, stop_reference
from reference import ReferenceQueue, ReferenceSubscriber

from aiodelayq import DelayedQueue


async def run(bench: Bench) -> dict[str, Any]:
    """One process, two clients: a producer offers batches of 1000 items due at once (delay 0) while at
    most ``e2e_backlog`` are offered but not yet consumed; a consumer takes them (ours: ``take_many(1000)``
    on an opened queue; reference: its transfer scheduler plus a ``BLPOP`` loop). msgs/s = items
    consumed during ``e2e_seconds`` / ``e2e_seconds``."""
    s = bench.sizes
    rates: dict[str, list[float]] = {"ours": [], "reference": []}
    for rnd in range(s.rounds):
        for impl in ("ours", "reference"):
            rate = await _e2e(bench, impl)
            rates[impl].append(rate)
            log(f"    round {rnd + 1} {impl:9}: {rate:,.0f} msgs/s")
    ours, ref = median(rates["ours"]), median(rates["reference"])
    return {"seconds": s.e2e_seconds, "backlog_cap": s.e2e_backlog,
            "ours": {"msgs_per_s": ours, "rounds": rates["ours"]},
            "reference": {"msgs_per_s": ref, "rounds": rates["reference"]},
            "ratio": ours / ref if ours and ref else None}


async def _e2e(bench: Bench, impl: str) -> float:
    s = bench.sizes
    name = bench.name("e2e", impl)
    producer, consumer = bench.client(), bench.client()
    loop = asyncio.get_running_loop()
    state = {"offered": 0, "consumed": 0, "stop": False}
    sub = None
    ref_c = None
    cq: DelayedQueue[Any] = DelayedQueue(consumer, name)
    try:
        if impl == "ours":
            pq: DelayedQueue[Any] = DelayedQueue(producer, name)
            await cq.open()
            send: Callable[[Any], Awaitable[list[int]]] = pq.offer_many

            async def take() -> int:
                return len(await cq.take_many(1000, timeout=0.2))
        else:
            ref_p = await ReferenceQueue(producer, name).prepare()
            ref_c = await ReferenceQueue(consumer, name).prepare(ref_p.shas)
            sub = ReferenceSubscriber(consumer)
            ref_c.start(sub)
            await sub.start()
            send = ref_p.offer_pipeline
            rc = ref_c

            async def take() -> int:
                return 0 if await rc.take(0.2) is None else 1

        async def produce() -> None:
            i = 0
            while not state["stop"]:
                if state["offered"] - state["consumed"] >= s.e2e_backlog:
                    await asyncio.sleep(0.001)
                    continue
                await send([(payload(j), 0) for j in range(i, i + 1000)])
                i += 1000
                state["offered"] = i

        async def consume() -> None:
            while not state["stop"]:
                got = await take()
                if not state["stop"]:
                    state["consumed"] += got

        tasks = [loop.create_task(produce()), loop.create_task(consume())]
        t0 = time.perf_counter()
        await asyncio.sleep(s.e2e_seconds)
        consumed = state["consumed"]
        elapsed = time.perf_counter() - t0
        state["stop"] = True
        done, pending = await asyncio.wait(tasks, timeout=10.0)
        for task in pending:
            task.cancel()
        for task in done:
            if task.exception() is not None:
                raise RuntimeError("e2e task failed") from task.exception()
        return consumed / elapsed
    finally:
        await cq.aclose()
        await stop_reference(ref_c, sub)
        await producer.aclose()
        await consumer.aclose()
        await bench.drop(name)
