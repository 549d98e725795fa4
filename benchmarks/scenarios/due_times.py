"""Scenario ``due_times``: how far past "server time at the call + delay" bulk offers fall due under load."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from _harness import FAR_S, Bench, log, payload, summarize

from aiodelayq import DelayedQueue
from aiodelayq._redis.client_facts import facts_for
from aiodelayq._wire.clock import ServerClock

LOADERS = 4
BATCH = 1000


async def _load(bench: Bench, name: str, stop: asyncio.Event) -> None:
    """Keep the server busy: batches of 1,000 offers to a queue of its own, back to back."""
    client = bench.client()
    q: DelayedQueue[Any] = DelayedQueue(client, name)
    batch = [(payload(i), FAR_S) for i in range(BATCH)]
    try:
        while not stop.is_set():
            await q.offer_many(batch)
    finally:
        await client.aclose()


async def run(bench: Bench) -> dict[str, Any]:
    """While ``LOADERS`` (4) other clients offer batches of 1,000 items back to back (each holds the server
    ~1-2 ms), this process calls ``offer_many`` with 1,000 items (delay 1 h) ``due_calls`` times each
    way, alternating: "ours" (the producer sends the call's issue time, as the library does) and "script
    time" (a client whose server-clock estimate is cleared before each call, so the script uses its own
    clock, read when the script finally runs). Lag of a call = its first item's due time - delay - the
    server clock when the call was issued (this process's clock + the offset measured at the start).
    Negative would mean early."""
    s = bench.sizes
    loaders = [bench.name("due_times", f"load{i}") for i in range(LOADERS)]
    stop = asyncio.Event()
    load = [asyncio.ensure_future(_load(bench, n, stop)) for n in loaders]
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
        for task in load:
            with contextlib.suppress(Exception):
                await task
        await bench.drop(*loaders)
    out: dict[str, Any] = {"calls": s.due_calls, "batch": BATCH, "loaders": LOADERS}
    for impl, values in lags.items():
        out[impl] = {"lag_ms": summarize(values), "early": sum(1 for v in values if v < -1.0)}
        lag = out[impl]["lag_ms"]
        log(f"    {impl:11}: due-time lag p50={lag['p50']:.2f} ms p99={lag['p99']:.2f} ms max={lag['max']:.2f} ms")
    return out
