"""Scenario ``due_times``: how far past "server time at the call + delay" bulk offers fall due under load."""

from __future__ import annotations

import asyncio
from typing import Any

from _harness import FAR_S, Bench, payload, summarize

from aiodelayq import DelayedQueue
from aiodelayq._redis.client_facts import facts_for
from aiodelayq._wire.clock import ServerClock

LOADERS = 4
BATCH = 1000


async def _load(bench: Bench, stop: asyncio.Event) -> None:
    """Keep the server busy: batches of 1,000 offers to a queue of its own, back to back."""
    async with bench.fresh_queue("due_times", "load") as (client, name):
        q: DelayedQueue[Any] = DelayedQueue(client, name)
        while not stop.is_set():
            await q.offer_many([(payload(i), FAR_S) for i in range(BATCH)])


async def run(bench: Bench) -> dict[str, Any]:
    """While ``LOADERS`` (4) other clients offer batches of 1,000 items back to back (each holds the server
    ~1-2 ms), this process calls ``offer_many`` with 1,000 items (delay 1 h) ``due_calls`` times each
    way, alternating: "ours" (the producer sends the call's issue time, as the library does) and "script
    time" (a client whose server-clock estimate is cleared before each call, so the script uses its own
    clock, read when the script finally runs). Lag of a call = its first item's due time - delay - the
    server clock when the call was issued (this process's clock + the offset measured at the start).
    Negative would mean early."""
    s = bench.sizes
    stop = asyncio.Event()
    load = [asyncio.ensure_future(_load(bench, stop)) for _ in range(LOADERS)]
    lags: dict[str, list[float]] = {"ours": [], "script_time": []}
    batch = [(payload(i), FAR_S) for i in range(BATCH)]
    try:
        async with bench.fresh_queue("due_times", "ours") as (ours_client, ours_name), \
                bench.fresh_queue("due_times", "script") as (script_client, script_name):
            queues = {"ours": DelayedQueue(ours_client, ours_name),
                      "script_time": DelayedQueue(script_client, script_name)}
            for q in queues.values():
                await q.offer(payload(0), FAR_S)  # scripts loaded, and ours has an estimate
            for _ in range(s.due_calls):
                for impl, q in queues.items():
                    if impl == "script_time":
                        facts_for(script_client).clock = ServerClock()
                    issued_ms = bench.server_now_ms()
                    dues = await q.offer_many(batch)
                    lags[impl].append(dues[0] - FAR_S * 1000 - issued_ms)
    finally:
        stop.set()
        await asyncio.gather(*load, return_exceptions=True)
    out: dict[str, Any] = {"calls": s.due_calls, "batch": BATCH, "loaders": LOADERS}
    for impl, values in lags.items():
        out[impl] = {"lag_ms": summarize(values), "early": sum(1 for v in values if v < -1.0)}
    return out
