"""Scenarios ``lateness``, ``lateness_async_for`` and ``reliable_lateness``: items falling due at a steady
rate, consumed by other processes while this process produces them."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict
from typing import Any, cast

from _harness import Bench, Child, cpu_placement, log_histogram, percentile, produce_spread, summarize, until
from redis.asyncio import Redis
from reference import ReferenceQueue, consuming

from aiodelayq import DelayedQueue


async def run(bench: Bench) -> dict[str, Any]:
    """``lateness_rate`` items/s falling due for ``lateness_seconds`` s. A consumer process opens the queue
    and takes: ours with ``take_many(1000)``, the reference with a ``BLPOP`` loop (its transfer task
    runs in that process too). This process produces: every 50 ms it offers every item whose target due
    time is within 0.5 s (ours: ``offer_many``; reference: a pipeline of offer scripts). Lateness = receipt
    time - due time, on the server clock for ours (due times are server ms; the offset between the clocks
    is measured once with ``TIME``) and on the client clock for the reference (its due times are client
    ms). This process on CPU 0, the consumer and the server on the others (``_harness.cpu_placement``)."""
    s = bench.sizes
    return {"rate": s.lateness_rate, "seconds": s.lateness_seconds,
            **{impl: await _steady(bench, impl, s.lateness_rate, s.lateness_seconds)
               for impl in ("ours", "reference")}}


async def run_async_for(bench: Bench) -> dict[str, Any]:
    """``async_for_rate`` items/s falling due for ``lateness_seconds`` s; the consumer process runs
    ``async for item in queue`` (one item per iteration, served by the take pump's prefetch), the rest as
    in ``lateness``. No reference: the bar is absolute, judged with the producer on a CPU of its own;
    ``unpinned`` repeats the run with the kernel placing the processes (reported, no bar)."""
    s = bench.sizes
    out = {"rate": s.async_for_rate, "seconds": s.lateness_seconds,
           "ours": await _steady(bench, "ours_async_for", s.async_for_rate, s.lateness_seconds)}
    if out["ours"]["placement"]["pinned"]:
        out["unpinned"] = await _steady(bench, "ours_async_for", s.async_for_rate, s.lateness_seconds, pin=False)
    return out


async def run_reliable(bench: Bench) -> dict[str, Any]:
    """``reliable_rate`` items/s falling due for ``reliable_seconds`` s, consumed by ``reliable_consumers``
    processes, each opening the queue on its own client and running ``async for msg in
    q.messages(reliable_vt_s): await msg.ack()``; produced as in ``lateness``, unpinned. Lateness = server
    clock at the first receipt - due time. The run ends when the zset, the destination and the in-flight
    zset are all empty (or at window end + 5 s); then the consumers close. Lost = offered and found
    nowhere; items still queued at the end are counted apart (``undelivered_still_queued``); duplicates =
    receipts beyond the first. With it, from the same run: a ``PING`` through ``redis.asyncio`` every 20 ms
    during the window, the load average before and after, and the CPU busy share over the window. No
    reference: Redisson's ``RDelayedQueue`` has no reliable consumption."""
    s = bench.sizes
    pings_ms: list[float] = []
    extra: dict[str, Any] = {}

    async def during(ctl: Redis, name: str, window: Callable[[], Awaitable[int]]) -> int:
        keys = DelayedQueue(ctl, name).keys
        loop = asyncio.get_running_loop()
        load, cpu, t0 = os.getloadavg(), _cpu_times(), loop.time()
        stop_pinging = asyncio.Event()
        pinger = asyncio.ensure_future(_ping_every(bench.client(), 0.02, pings_ms, stop_pinging))
        try:
            clamped = await window()

            await until(lambda: asyncio.gather(ctl.zcard(keys.timeout_set), ctl.llen(keys.destination),
                                               ctl.zcard(keys.in_flight)), lambda left: not any(left),  # nothing left
                        t0 + 0.5 + s.reliable_seconds + 5.5 - loop.time(), 0.05)
        finally:
            stop_pinging.set()  # not cancel(): redis-py can swallow a cancellation inside ping()
            await asyncio.wait({pinger})
        cpu_after = _cpu_times()
        busy = 100.0 * (cpu_after[0] - cpu[0]) / (cpu_after[1] - cpu[1]) if cpu_after[1] > cpu[1] else None
        extra.update(elapsed_s=loop.time() - t0, load={"loadavg_before": list(load), "cpu_busy_pct": busy,
                                                       "loadavg_after": list(os.getloadavg()), "nproc": os.cpu_count()})
        queued = {json.loads(raw)["order"] for raw in await ctl.lrange(keys.destination, 0, -1)}
        queued.update(json.loads(e[32:])["order"] for e in cast(list[bytes], await ctl.zrange(keys.in_flight, 0, -1)))
        queued.update(_fast_element_order(e) for e in cast(list[bytes], await ctl.zrange(keys.timeout_set, 0, -1)))
        extra["still_queued"] = queued  # message header: 32 bytes
        return clamped

    out = await _steady(bench, "ours_reliable", s.reliable_rate, s.reliable_seconds, consumers=s.reliable_consumers,
                        pin=False, during=during)
    still = extra.pop("still_queued")
    lost = out.pop("lost_ids")
    out.update(consumers=s.reliable_consumers, visibility_timeout_s=s.reliable_vt_s,
               lost=sum(1 for i in lost if i not in still), undelivered_still_queued=sum(1 for i in lost if i in still),
               ping_ms={"p50": percentile(sorted(pings_ms), 50), "p99": percentile(sorted(pings_ms), 99)}, **extra)
    return out


async def _steady(bench: Bench, impl: str, rate: float, seconds: float, *, consumers: int = 1, pin: bool = True,
                  during: Callable[..., Awaitable[int]] | None = None) -> dict[str, Any]:
    """``consumers`` processes of ``impl`` (``ours``: ``take_many(1000)``; ``ours_async_for``: ``async for``;
    ``ours_reliable``: ``messages()`` + ``ack()``; ``reference``) and this process producing ``rate``
    items/s due over ``seconds`` s (``during(ctl, name, window)`` wraps the production); lateness from each
    item's first receipt."""
    total = round(rate * seconds)
    bound_s = 0.5 + seconds + 0.5 + 5.0
    due: dict[int, float] = {}
    async with bench.fresh_queue("lateness", impl) as (client, name):
        args = (bench.url, name, impl, total, bound_s + (30 if impl == "ours_reliable" else 0),
                bench.sizes.reliable_vt_s)
        procs: list[Child] = []
        try:
            for _ in range(consumers):
                procs.append(await Child.python("scenarios.lateness.consume", *args))
            for proc in procs:
                await proc.line(60.0)  # "ready"
            if impl.startswith("ours"):
                now_ms, send = bench.server_now_ms, DelayedQueue(client, name).offer_many
            else:  # the reference's due times are its own clock's
                now_ms, send = (lambda: time.time() * 1000.0), (await ReferenceQueue(client, name).prepare()).offer_many

            async def window() -> int:
                return await produce_spread(send, now_ms, due, total=total, rate=rate, bound_s=bound_s, label=impl)

            with (cpu_placement(bench.server, [procs[0].proc.pid]) if pin
                  else contextlib.nullcontext({"pinned": False, "why": "not asked"})) as placement:
                clamped = await (during(bench.ctl, name, window) if during else window())
                for proc in procs if impl == "ours_reliable" else ():  # the others stop when all came
                    await proc.send("stop")
                # The last items fall due after the last send: the placement holds until the consumers are done.
                results = [json.loads(await proc.line(bound_s + 30.0)) for proc in procs]
        finally:
            for proc in procs:
                await proc.stop()
    first: dict[int, float] = {}
    for res in results:
        for i, t in zip(res["ids"], res["times"], strict=True):
            first[i] = min(t, first.get(i, t))
    shift = bench.offset_ms if impl.startswith("ours") else 0.0
    lat = [t + shift - due[i] for i, t in first.items() if i in due]
    summary = summarize(lat)
    out = {"count": total, "offered": len(due), "delivered": len(first), "lost": sum(1 for i in due if i not in first),
           "duplicates": sum(len(r["ids"]) for r in results) - len(first), "producer_clamped": clamped,
           "lateness_ms": summary, "histogram": log_histogram(lat), "placement": placement,
           "per_consumer": [{"received": len(r["ids"]), "cpu_s": r["cpu_s"], "stats": r["stats"]} for r in results]}
    if impl == "ours_reliable":
        out.update(rate=rate, seconds=seconds, lost_ids=[i for i in due if i not in first],
                   redelivered=sum(r["redelivered"] for r in results), ack_false=sum(r["ack_false"] for r in results))
    return out


async def consume(url: str, name: str, impl: str, total: int, bound_s: float, vt_s: float) -> dict[str, Any]:
    """(A consumer process.) Open the queue (ours) or start the reference transfer task, say ``ready``, then take
    until ``total`` items arrived or ``bound_s`` passed; ``ours_reliable``: ``async for msg in
    q.messages(vt_s): await msg.ack()`` until the parent sends ``stop`` (or ``bound_s`` passed). The ids and
    receipt times (local epoch ms), the queue's stats."""
    client = Redis.from_url(url, decode_responses=False)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + bound_s
    ids: list[int] = []
    times: list[float] = []
    out: dict[str, Any] = {"redelivered": 0, "ack_false": 0}

    def got(items: list[Any]) -> None:
        ids.extend(item["order"] for item in items)
        times.extend([time.time() * 1000.0] * len(items))

    def left_s() -> float:
        return min(0.5, max(0.01, deadline - loop.time()))

    try:
        if impl == "reference":
            async with consuming(client, name) as ref:
                print("ready", flush=True)
                while len(ids) < total and loop.time() < deadline:
                    if (item := await ref.take(left_s())) is not None:
                        got([item])
                out["stats"] = {"transfers": ref.transfers, "errors": ref.errors}
            return {"ids": ids, "times": times, **out}
        async with DelayedQueue(client, name) as queue:
            print("ready", flush=True)
            if impl == "ours_reliable":
                # The parent says when everything was delivered and acked: closing the queue ends the loop.
                stopper = asyncio.ensure_future(asyncio.wait_for(asyncio.to_thread(sys.stdin.readline), bound_s))
                closing: list[asyncio.Future[None]] = []  # referenced until it ends
                stopper.add_done_callback(lambda _: closing.append(asyncio.ensure_future(queue.aclose())))
                async for msg in queue.messages(vt_s):
                    got([msg.value])
                    out["redelivered"] += msg.delivery_count > 1
                    out["ack_false"] += not await msg.ack()
                with contextlib.suppress(asyncio.TimeoutError):
                    await stopper
            elif impl == "ours_async_for":

                async def one_by_one() -> None:
                    async for item in queue:  # one item per iteration: the way most users consume
                        got([item])
                        if len(ids) >= total:
                            return

                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(one_by_one(), bound_s)
            while impl != "ours_reliable" and len(ids) < total and loop.time() < deadline:
                got(await queue.take_many(1000, timeout=left_s()))
            out["stats"] = asdict(queue.stats)
    finally:
        await client.aclose()
    return {"ids": ids, "times": times, **out}


def _cpu_times() -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs from ``/proc/stat`` (Linux; (0, 0) elsewhere)."""
    with contextlib.suppress(OSError, ValueError), open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
        return sum(fields) - fields[3] - fields[4], sum(fields)  # all but idle and iowait
    return 0, 0


def _fast_element_order(element: bytes) -> int:
    """The ``order`` of a pending fast element (``Bc0Lc0``: 20, 20-byte id, native length, payload); -1 if
    it cannot be read."""
    for size in (8, 4):  # the server's native 'L'
        with contextlib.suppress(ValueError, KeyError, TypeError):
            return int(json.loads(element[21 + size:])["order"])
    return -1


async def _ping_every(client: Redis, interval_s: float, out: list[float], stop: asyncio.Event) -> None:
    """Append one ``PING`` round trip (ms) every ``interval_s`` until ``stop`` is set; then close ``client``."""
    try:
        while not stop.is_set():
            t0 = time.perf_counter()
            await client.ping()
            out.append((time.perf_counter() - t0) * 1000.0)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), interval_s)
    finally:
        await client.aclose()
