"""Scenarios ``lateness`` and ``lateness_async_for``: items falling due at a steady rate, taken by a
consumer process."""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import time
from typing import Any

from _harness import (
    Bench,
    child_main,
    cpu_placement,
    join_or_terminate,
    lateness_consume,
    log,
    log_histogram,
    produce_spread,
    ratio,
    summarize,
)
from reference import ReferenceQueue
from report import fmt_ms

from aiodelayq import DelayedQueue


async def run(bench: Bench) -> dict[str, Any]:
    """``lateness_rate`` items/s falling due for ``lateness_seconds`` s. A consumer in a separate process
    (spawned) opens the queue and takes: ours with ``take_many(1000)``, the reference with a ``BLPOP``
    loop (its transfer scheduler runs in that process too). This process produces: every 50 ms it offers
    every item whose target due time is within 0.5 s (ours: ``offer_many``; reference: a pipeline of offer
    scripts). Lateness = receipt time - due time, on the server clock for ours (due times are server
    ms; the offset between the clocks is measured once with ``TIME``) and on the client clock for the
    reference (its due times are client ms)."""
    s = bench.sizes
    out: dict[str, Any] = {"rate": s.lateness_rate, "seconds": s.lateness_seconds}
    for impl in ("ours", "reference"):
        out[impl] = await lateness(bench, impl, s.lateness_rate, s.lateness_seconds)
    o, r = out["ours"]["lateness_ms"], out["reference"]["lateness_ms"]
    out["ratio"] = {k: ratio(o[k], r[k]) for k in ("p50", "p99", "max")}
    return out


async def run_async_for(bench: Bench) -> dict[str, Any]:
    """``async_for_rate`` items/s falling due for ``lateness_seconds`` s; the consumer process runs
    ``async for item in queue`` (one item per iteration, served by the take pump's prefetch), the rest as
    in ``lateness``. No reference: the bar is absolute, judged with the producer on a CPU of its own;
    ``unpinned`` repeats the run with the kernel placing the processes (reported, no bar)."""
    s = bench.sizes
    out = {"rate": s.async_for_rate, "seconds": s.lateness_seconds,
           "ours": await lateness(bench, "ours_async_for", s.async_for_rate, s.lateness_seconds)}
    if out["ours"]["placement"]["pinned"]:
        out["unpinned"] = await lateness(bench, "ours_async_for", s.async_for_rate, s.lateness_seconds, pin=False)
    return out


async def lateness(bench: Bench, impl: str, rate: float, seconds: float, *, pin: bool = True) -> dict[str, Any]:
    """One consumer process of ``impl`` (``ours``: ``take_many(1000)``; ``ours_async_for``: ``async for``;
    ``reference``) and this process producing ``rate`` items/s due over ``seconds`` s. ``pin``: this
    process on CPU 0, the consumer and the server on the others (``_harness.cpu_placement``)."""
    total = round(rate * seconds)
    name = bench.name("lateness", impl)
    start_offset_s, lead_s = 0.5, 0.5
    bound_s = start_offset_s + seconds + lead_s + 5.0
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=child_main, args=(child, lateness_consume, bench.url, name, impl, total, bound_s),
                       name=f"lateness-consumer-{impl}", daemon=True)
    client = bench.client()
    due: dict[int, float] = {}
    try:
        proc.start()
        msg = parent.recv() if await asyncio.to_thread(parent.poll, 60.0) else "nothing within 60 s"
        if msg != "ready":
            raise RuntimeError(f"lateness consumer did not start: {msg}")
        if impl.startswith("ours"):
            now_ms, send = bench.server_now_ms, DelayedQueue(client, name).offer_many
        else:  # the reference's due times are its own clock's
            ref = await ReferenceQueue(client, name).prepare()
            now_ms, send = (lambda: time.time() * 1000.0), ref.offer_pipeline
        with (cpu_placement(bench.server, [proc.pid]) if pin and proc.pid is not None
              else contextlib.nullcontext({"pinned": False, "why": "not asked"})) as placement:
            clamped = await produce_spread(send, now_ms, due, total=total, rate=rate, start_offset_s=start_offset_s,
                                           lead_s=lead_s, tick_s=0.05, bound_s=bound_s, label=impl)
            # The last items fall due after the last send: the placement holds until the consumer is done.
            if not await asyncio.to_thread(parent.poll, bound_s + 30.0):
                raise RuntimeError("lateness consumer sent no result")
            res = parent.recv()
        if "error" in res:
            raise RuntimeError(f"lateness consumer failed: {res['error']}")
    finally:
        await join_or_terminate(proc)
        await client.aclose()
        await bench.drop(name)
    shift = bench.offset_ms if impl.startswith("ours") else 0.0
    lat = [t + shift - due[i] for i, t in zip(res["ids"], res["times"], strict=True) if i in due]
    received = set(res["ids"])
    summary = summarize(lat)
    log(f"    {impl:9} ({'pinned' if placement['pinned'] else 'unpinned'}): delivered {len(received):,}/{total:,}, "
        f"lateness p50={fmt_ms(summary['p50'])} p99={fmt_ms(summary['p99'])} max={fmt_ms(summary['max'])}, "
        f"consumer CPU {res['cpu_s']:.1f} s")
    return {"count": total, "delivered": len(received), "lost": sum(1 for i in due if i not in received),
            "duplicates": len(res["ids"]) - len(received), "producer_clamped": clamped, "lateness_ms": summary,
            "histogram": log_histogram(lat), "consumer_stats": res["stats"], "consumer_cpu_s": res["cpu_s"],
            "placement": placement}
