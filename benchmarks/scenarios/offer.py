"""Scenario ``offer``: concurrent awaiting callers, one offer at a time each."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from _harness import FAR_S, Bench, log, median, payload
from reference import ReferenceQueue

from aiodelayq import DelayedQueue


async def run(bench: Bench) -> dict[str, Any]:
    """``offer_callers`` tasks, each awaiting one offer at a time in a loop for ``offer_seconds``
    (delay 1 h, nothing falls due); items/s = completed offers / elapsed. Ours: ``await q.offer()`` (the
    library coalesces concurrent offers); reference: one ``EVALSHA`` of Redisson's offer script per item,
    on redis-py's connection pool (up to one connection per caller)."""
    s = bench.sizes
    rates: dict[str, list[float]] = {"ours": [], "reference": []}
    for rnd in range(s.rounds):
        for impl in ("ours", "reference"):
            async with bench.fresh_queue("offer", impl) as (client, name):
                if impl == "ours":
                    q: DelayedQueue[Any] = DelayedQueue(client, name)
                    await q.offer(payload(0), FAR_S)  # warm-up: script load, connection
                    offer: Callable[[Any, float], Awaitable[int]] = q.offer
                else:
                    ref = await ReferenceQueue(client, name).prepare()
                    await ref.offer(payload(0), FAR_S)
                    offer = ref.offer
                done = 0
                loop = asyncio.get_running_loop()
                stop_at = loop.time() + s.offer_seconds

                async def caller(c: int, offer: Callable[[Any, float], Awaitable[int]] = offer,
                                 stop_at: float = stop_at, loop: asyncio.AbstractEventLoop = loop) -> None:
                    nonlocal done
                    i = c
                    while loop.time() < stop_at:
                        await offer(payload(i), FAR_S)
                        done += 1
                        i += s.offer_callers

                t0 = time.perf_counter()
                await asyncio.gather(*(caller(c) for c in range(s.offer_callers)))
                elapsed = time.perf_counter() - t0
                pending = await bench.ctl.zcard(DelayedQueue(bench.ctl, name).keys.timeout_set)
                rate = done / elapsed
                rates[impl].append(rate)
                log(f"    round {rnd + 1} {impl:9}: {done:,} offers in {elapsed:.2f} s = {rate:,.0f} items/s "
                    f"(zset {pending - 1:,})")
    ours, ref = median(rates["ours"]), median(rates["reference"])
    return {"callers": s.offer_callers, "seconds": s.offer_seconds,
            "ours": {"items_per_s": ours, "rounds": rates["ours"]},
            "reference": {"items_per_s": ref, "rounds": rates["reference"],
                          "method": "one EVALSHA of Redisson's offer script per offer"},
            "ratio": ours / ref if ours and ref else None}
