"""Scenario ``offer_many``: batches of offers, one batch at a time."""

from __future__ import annotations

import time
from typing import Any

from _harness import FAR_S, Bench, paired, payload
from reference import ReferenceQueue

from aiodelayq import DelayedQueue


async def run(bench: Bench) -> dict[str, Any]:
    """``offer_many_items`` items in batches of ``offer_many_batch`` (delay 1 h), one batch at a time:
    items per second. Ours: ``await q.offer_many(batch)``; reference: a redis-py pipeline
    (``transaction=False``) of one offer script per item, one round trip per batch. The worst server
    time of one of our ``offer_many`` script calls comes from ``SLOWLOG``."""
    s = bench.sizes
    worst: list[float] = []
    batches = [[(payload(i), FAR_S) for i in range(b, min(b + s.offer_many_batch, s.offer_many_items))]
               for b in range(0, s.offer_many_items, s.offer_many_batch)]

    async def measure(impl: str) -> float:
        async with bench.fresh_queue("offer_many", impl) as (client, name):
            if impl == "ours":
                q: DelayedQueue[Any] = DelayedQueue(client, name)
                await q.offer(payload(0), FAR_S)
                send = q.offer_many
                await bench.slowlog.begin()
            else:
                ref = await ReferenceQueue(client, name).prepare()
                await ref.offer(payload(0), FAR_S)
                send = ref.offer_pipeline
            t0 = time.perf_counter()
            for batch in batches:
                await send(batch)
            elapsed = time.perf_counter() - t0
            if impl == "ours":
                channel = DelayedQueue(bench.ctl, name).keys.channel.encode()
                worst.extend(await bench.slowlog.end(lambda a: a[0] == b"EVALSHA" and channel in a) or [])
            return s.offer_many_items / elapsed

    out = {"items": s.offer_many_items, "batch": s.offer_many_batch, **await paired(bench, measure, "items_per_s")}
    out["ours"]["worst_script_ms"] = max(worst, default=None)
    return out
