"""Scenario ``offer``: concurrent awaiting callers, one offer at a time each."""

from __future__ import annotations

from typing import Any

from _harness import FAR_S, Bench, concurrent_rate, paired, payload
from reference import ReferenceQueue

from aiodelayq import DelayedQueue


async def run(bench: Bench) -> dict[str, Any]:
    """``offer_callers`` tasks, each awaiting one offer at a time in a loop for ``offer_seconds`` (delay
    1 h, nothing falls due): completed offers per second. Ours: ``await q.offer()`` (the library
    coalesces concurrent offers); reference: one ``EVALSHA`` of Redisson's offer script per item, on
    redis-py's connection pool (up to one connection per caller)."""
    s = bench.sizes

    async def measure(impl: str) -> float:
        async with bench.fresh_queue("offer", impl) as (client, name):
            if impl == "ours":
                offer = DelayedQueue(client, name).offer
            else:
                offer = (await ReferenceQueue(client, name).prepare()).offer
            await offer(payload(0), FAR_S)  # warm-up: script load, connection
            return await concurrent_rate(lambda i: offer(payload(i), FAR_S), s.offer_callers, s.offer_seconds)

    return {"callers": s.offer_callers, "seconds": s.offer_seconds, **await paired(bench, measure, "items_per_s")}
