"""Scenario ``reliable_lateness`` (ours only): reliable consumption in several processes."""

from __future__ import annotations

import asyncio
import contextlib
import json
import multiprocessing
import os
import time
from typing import Any, cast

from _harness import (
    Bench,
    busy_share,
    child_main,
    cpu_times,
    join_or_terminate,
    log,
    log_histogram,
    percentile,
    produce_spread,
    reliable_consume,
    summarize,
)
from redis.asyncio import Redis
from report import fmt_ms, fmt_pct

from aiodelayq import DelayedQueue


async def run(bench: Bench) -> dict[str, Any]:
    """``reliable_rate`` items/s falling due for ``reliable_seconds`` s, consumed by ``reliable_consumers``
    separate (spawned) processes, each opening the queue on its own client and running ``async for msg in
    q.messages(30): await msg.ack()``. This process produces as in ``lateness``. Lateness = server clock
    at the first receipt - due time. The run ends when the zset, the destination and the in-flight zset
    are all empty (or at window end + 5 s); then the consumers close. Lost = offered and found nowhere;
    items still queued at the end are counted apart (``undelivered_still_queued``); duplicates = receipts
    beyond the first. With it, from the same run: a ``PING`` through ``redis.asyncio`` every 20 ms during
    the window, the load average before and after, and the CPU busy share over the window. No reference:
    Redisson's ``RDelayedQueue`` has no reliable consumption."""
    s = bench.sizes
    total = round(s.reliable_rate * s.reliable_seconds)
    name = bench.name("reliable_lateness", "ours")
    bound_s = 0.5 + s.reliable_seconds + 0.5 + 5.0
    ctx = multiprocessing.get_context("spawn")
    procs: list[Any] = []
    pipes: list[Any] = []
    client, ping_client = bench.client(), bench.client()
    keys = DelayedQueue(bench.ctl, name).keys
    due: dict[int, float] = {}
    results: list[dict[str, Any]] = []
    pings_ms: list[float] = []
    try:
        for n in range(s.reliable_consumers):
            parent, child = ctx.Pipe()
            procs.append(ctx.Process(target=child_main, name=f"reliable-consumer-{n}", daemon=True,
                                     args=(child, reliable_consume, bench.url, name, s.reliable_vt_s, bound_s + 30)))
            procs[-1].start()
            pipes.append(parent)
        for parent in pipes:
            msg = parent.recv() if await asyncio.to_thread(parent.poll, 60.0) else "nothing within 60 s"
            if msg != "ready":
                raise RuntimeError(f"reliable consumer did not start: {msg}")
        loop = asyncio.get_running_loop()
        load_before, cpu_before, t0 = os.getloadavg(), cpu_times(), loop.time()
        stop_pinging = asyncio.Event()
        pinger = asyncio.ensure_future(_ping_every(ping_client, 0.02, pings_ms, stop_pinging))
        try:
            clamped = await produce_spread(DelayedQueue(client, name).offer_many, bench.server_now_ms, due,
                                           total=total, rate=s.reliable_rate, start_offset_s=0.5, lead_s=0.5,
                                           tick_s=0.05, bound_s=bound_s, label="ours (reliable)")
            while loop.time() < t0 + bound_s:  # until nothing is pending, ready or in flight
                if not any([await bench.ctl.zcard(keys.timeout_set), await bench.ctl.llen(keys.destination),
                            await bench.ctl.zcard(keys.in_flight)]):
                    break
                await asyncio.sleep(0.05)
            elapsed = loop.time() - t0
        finally:
            stop_pinging.set()  # not cancel(): redis-py can swallow a cancellation inside ping()
            await asyncio.wait({pinger})
        cpu_after, load_after = cpu_times(), os.getloadavg()
        for parent in pipes:
            parent.send("stop")
        for parent in pipes:
            res = parent.recv() if await asyncio.to_thread(parent.poll, 30.0) else {"error": "no result in 30 s"}
            if "error" in res:
                raise RuntimeError(f"reliable consumer failed: {res['error']}")
            results.append(res)
        still_queued = {json.loads(raw_item)["order"] for raw_item in await bench.ctl.lrange(keys.destination, 0, -1)}
        for element in cast(list[bytes], await bench.ctl.zrange(keys.in_flight, 0, -1)):
            still_queued.add(json.loads(element[32:])["order"])  # message header: 32 bytes
        for element in cast(list[bytes], await bench.ctl.zrange(keys.timeout_set, 0, -1)):
            still_queued.add(_fast_element_order(element))
    finally:
        for proc in procs:
            await join_or_terminate(proc)
        await client.aclose()
        await ping_client.aclose()
        await bench.drop(name)
    first: dict[int, float] = {}
    for res in results:
        for i, t in zip(res["ids"], res["times"], strict=True):
            first[i] = min(t, first.get(i, t))
    lat = [t + bench.offset_ms - due[i] for i, t in first.items() if i in due]
    summary = summarize(lat)
    pings_ms.sort()
    busy = busy_share(cpu_before, cpu_after)
    result = {
        "rate": s.reliable_rate, "seconds": s.reliable_seconds, "consumers": s.reliable_consumers,
        "visibility_timeout_s": s.reliable_vt_s, "count": total, "offered": len(due), "delivered": len(first),
        "lost": sum(1 for i in due if i not in first and i not in still_queued),
        "undelivered_still_queued": sum(1 for i in due if i not in first and i in still_queued),
        "duplicates": sum(len(r["ids"]) for r in results) - len(first),
        "redelivered": sum(r["redelivered"] for r in results), "ack_false": sum(r["ack_false"] for r in results),
        "producer_clamped": clamped, "elapsed_s": elapsed, "lateness_ms": summary, "histogram": log_histogram(lat),
        "ping_ms": {"p50": percentile(pings_ms, 50), "p99": percentile(pings_ms, 99)},
        "load": {"loadavg_before": list(load_before), "loadavg_after": list(load_after), "cpu_busy_pct": busy,
                 "nproc": os.cpu_count()},
        "per_consumer": [{"received": len(r["ids"]), "cpu_s": r["cpu_s"], "transfers": r["stats"]["transfers"]}
                         for r in results],
    }
    log(f"    ours     : delivered {len(first):,}/{total:,} to {len(results)} processes, lost {result['lost']}, "
        f"still queued {result['undelivered_still_queued']}, duplicates {result['duplicates']}; lateness "
        f"p50={fmt_ms(summary['p50'])} p99={fmt_ms(summary['p99'])} max={fmt_ms(summary['max'])}")
    log(f"      PING p50 {fmt_ms(result['ping_ms']['p50'])} during the window; load {load_before[0]:.2f} -> "
        f"{load_after[0]:.2f}, CPU busy {fmt_pct(busy)} of {os.cpu_count()} CPUs")
    return result


def _fast_element_order(element: bytes) -> int:
    """The ``order`` of a pending fast element (``Bc0Lc0``: 20, 20-byte id, native length, payload); -1 if
    it cannot be read."""
    for size in (8, 4):  # the server's native 'L'
        with contextlib.suppress(ValueError, KeyError, TypeError):
            return int(json.loads(element[21 + size:])["order"])
    return -1


async def _ping_every(client: Redis, interval_s: float, out: list[float], stop: asyncio.Event) -> None:
    """Append one ``PING`` round trip (ms) every ``interval_s`` until ``stop`` is set."""
    while not stop.is_set():
        t0 = time.perf_counter()
        await client.ping()
        out.append((time.perf_counter() - t0) * 1000.0)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), interval_s)
