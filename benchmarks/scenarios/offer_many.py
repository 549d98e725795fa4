"""Scenario ``offer_many``: batches of offers, one batch at a time."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

from _harness import FAR_S, Bench, log, median, payload
from reference import ReferenceQueue

from aiodelayq import DelayedQueue


async def run(bench: Bench) -> dict[str, Any]:
    """``offer_many_items`` items in batches of ``offer_many_batch`` (delay 1 h), one batch at a time;
    items/s = items / elapsed. Ours: ``await q.offer_many(batch)``; reference: a redis-py pipeline
    (``transaction=False``) of one offer script per item, one round trip per batch. The worst server
    time of one of our ``offer_many`` script calls comes from ``SLOWLOG``."""
    s = bench.sizes
    rates: dict[str, list[float]] = {"ours": [], "reference": []}
    worst: list[float] = []
    batches = [[(payload(i), FAR_S) for i in range(b, min(b + s.offer_many_batch, s.offer_many_items))]
               for b in range(0, s.offer_many_items, s.offer_many_batch)]
    for rnd in range(s.rounds):
        for impl in ("ours", "reference"):
            async with bench.fresh_queue("offer_many", impl) as (client, name):
                if impl == "ours":
                    q: DelayedQueue[Any] = DelayedQueue(client, name)
                    await q.offer(payload(0), FAR_S)
                    send: Callable[[Any], Awaitable[list[int]]] = q.offer_many
                    await bench.slowlog.begin()
                else:
                    ref = await ReferenceQueue(client, name).prepare()
                    await ref.offer(payload(0), FAR_S)
                    send = ref.offer_pipeline
                t0 = time.perf_counter()
                for batch in batches:
                    await send(batch)
                elapsed = time.perf_counter() - t0
                keys = DelayedQueue(bench.ctl, name).keys
                if impl == "ours":
                    times = await bench.slowlog.end(
                        lambda a, k=keys: a[0] == b"EVALSHA" and k.channel.encode() in a)
                    if times:
                        worst.append(max(times))
                pending = await bench.ctl.zcard(keys.timeout_set) - 1
                rate = s.offer_many_items / elapsed
                rates[impl].append(rate)
                log(f"    round {rnd + 1} {impl:9}: {s.offer_many_items:,} items in {elapsed:.2f} s = "
                    f"{rate:,.0f} items/s (zset {pending:,})")
    ours, ref = median(rates["ours"]), median(rates["reference"])
    return {"items": s.offer_many_items, "batch": s.offer_many_batch,
            "ours": {"items_per_s": ours, "rounds": rates["ours"],
                     "worst_script_ms": max(worst) if worst else None},
            "reference": {"items_per_s": ref, "rounds": rates["reference"],
                          "method": "pipeline (transaction=False) of one offer script per item"},
            "ratio": ours / ref if ours and ref else None}
