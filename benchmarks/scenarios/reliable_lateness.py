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
    cpu_times,
    join_or_terminate,
    log,
    log_histogram,
    produce_spread,
    reliable_consumer_main,
    server_counters,
)
from lateness import client_ping_rtts_ms, percentile, raw_ping_rtts_ms, summarize
from redis.asyncio import Redis
from report import fmt_ms, fmt_pct

from aiodelayq import DelayedQueue


async def run(bench: Bench) -> dict[str, Any]:
    """``reliable_rate`` items/s falling due for ``reliable_seconds`` s, consumed reliably by
    ``reliable_consumers`` separate (spawned) processes, each opening the queue on its own client and
    running ``async for msg in q.messages(30): await msg.ack()``. This process produces as in
    ``lateness`` (every 50 ms, ``offer_many`` of every item due within 0.5 s). Lateness = server clock at
    receipt (local clock + the offset measured with ``TIME``) - due time, per item at its first receipt.
    The run ends when the zset, the destination and the in-flight zset are all empty (or at window end
    + 5 s); then the consumers are told to close. Lost = offered, never received; duplicates = receipts
    beyond the first. Reference round trip, same run: 500 ``PING``s on a raw socket and 500 through
    ``redis.asyncio`` just before the window (consumers already open and idle), and one ``redis.asyncio``
    ``PING`` every 20 ms during it. Load: ``os.getloadavg()`` before and after, CPU busy share over the
    window from ``/proc/stat``, CPU seconds of each consumer process. No reference implementation:
    Redisson's ``RDelayedQueue`` has no reliable consumption."""
    s = bench.sizes
    total = round(s.reliable_rate * s.reliable_seconds)
    name = bench.name("reliable_lateness", "ours")
    start_offset_s, lead_s, tick_s, grace_s = 0.5, 0.5, 0.05, 5.0
    bound_s = start_offset_s + s.reliable_seconds + lead_s + grace_s
    ctx = multiprocessing.get_context("spawn")
    procs: list[Any] = []
    pipes: list[Any] = []
    client = bench.client()
    due: dict[int, float] = {}
    keys = DelayedQueue(bench.ctl, name).keys
    results: list[dict[str, Any]] = []
    during: list[float] = []
    try:
        for n in range(s.reliable_consumers):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=reliable_consumer_main,
                               args=(child, bench.url, name, s.reliable_vt_s, bound_s + 30.0),
                               name=f"reliable-consumer-{n}", daemon=True)
            proc.start()
            procs.append(proc)
            pipes.append(parent)
        for parent in pipes:
            if not await asyncio.to_thread(parent.poll, 60.0):
                raise RuntimeError("reliable consumer did not start within 60 s")
            msg = parent.recv()
            if msg != "ready":
                raise RuntimeError(f"reliable consumer failed: {msg}")
        raw = await asyncio.to_thread(raw_ping_rtts_ms, bench.url, 500)
        ping_client = bench.client()
        try:
            idle_rtts = await client_ping_rtts_ms(ping_client, 500)
            q: DelayedQueue[Any] = DelayedQueue(client, name)
            loop = asyncio.get_running_loop()
            load_before = os.getloadavg()
            cpu_before = cpu_times()
            server_before = await server_counters(bench.ctl)
            t0 = loop.time()
            stop_pinging = asyncio.Event()
            pinger = asyncio.ensure_future(_ping_every(ping_client, 0.02, during, stop_pinging))
            try:
                clamped = await produce_spread(q.offer_many, bench.server_now_ms, due, total=total,
                                               rate=s.reliable_rate, start_offset_s=start_offset_s, lead_s=lead_s,
                                               tick_s=tick_s, bound_s=bound_s, label="ours (reliable)")
                # Done when nothing is pending, ready or in flight (every message acked).
                while loop.time() < t0 + bound_s:
                    left = [await bench.ctl.zcard(keys.timeout_set), await bench.ctl.llen(keys.destination),
                            await bench.ctl.zcard(keys.in_flight)]
                    if not any(left):
                        break
                    await asyncio.sleep(0.05)
                elapsed = loop.time() - t0
            finally:
                stop_pinging.set()  # not cancel(): redis-py can swallow a cancellation inside ping()
                await asyncio.wait({pinger})
            cpu_after = cpu_times()
            load_after = os.getloadavg()
            server_after = await server_counters(bench.ctl)
        finally:
            await ping_client.aclose()
        for parent in pipes:
            parent.send("stop")
        for parent in pipes:
            if not await asyncio.to_thread(parent.poll, 30.0):
                raise RuntimeError("reliable consumer sent no result")
            res = parent.recv()
            if "error" in res:
                raise RuntimeError(f"reliable consumer failed: {res['error']}")
            results.append(res)
        # Not received by the end of the bound but still queued (ready list, in flight, pending) is
        # "undelivered", not lost: lost = offered and nowhere.
        in_flight_left = await bench.ctl.zcard(keys.in_flight)
        still_queued: set[int] = set()
        for raw_item in await bench.ctl.lrange(keys.destination, 0, -1):
            still_queued.add(json.loads(raw_item)["order"])
        in_flight = cast(list[bytes], await bench.ctl.zrange(keys.in_flight, 0, -1))
        for element in in_flight:
            still_queued.add(json.loads(element[32:])["order"])  # message header: 32 bytes
        pending_left = await bench.ctl.zcard(keys.timeout_set)
        pending = cast(list[bytes], await bench.ctl.zrange(keys.timeout_set, 0, -1))
        for element in pending:
            still_queued.add(_fast_element_order(element))
    finally:
        for proc in procs:
            await join_or_terminate(proc)
        await client.aclose()
        await bench.drop(name)
    first: dict[int, float] = {}
    receipts = 0
    for res in results:
        receipts += len(res["ids"])
        for i, t in zip(res["ids"], res["times"], strict=True):
            if i not in first or t < first[i]:
                first[i] = t
    lat = [t + bench.offset_ms - due[i] for i, t in first.items() if i in due]
    summary = summarize(lat)
    raw_sorted, idle_sorted, during_sorted = sorted(raw or []), sorted(idle_rtts), sorted(during)
    busy = busy_share(cpu_before, cpu_after)
    window_start = min(due.values(), default=0.0)
    buckets: dict[int, list[float]] = {}
    for i, t in first.items():
        if i in due:
            buckets.setdefault(int((due[i] - window_start) // 1000), []).append(t + bench.offset_ms - due[i])
    timeline = []
    for sec in sorted(buckets):
        b = sorted(buckets[sec])
        timeline.append({"due_second": sec, "count": len(b), "p50": percentile(b, 50), "p99": percentile(b, 99),
                         "max": b[-1]})
    calls = {k: server_after["calls"].get(k, 0) - server_before["calls"].get(k, 0)
             for k in server_after["calls"]}
    calls = {k: v for k, v in sorted(calls.items(), key=lambda kv: -kv[1]) if v > 0}
    server = {"cpu_s": server_after["cpu_s"] - server_before["cpu_s"],
              "commands": server_after["commands"] - server_before["commands"], "calls": calls,
              "evalsha_per_item": calls.get("evalsha", 0) / total if total else None,
              "commands_per_item": (server_after["commands"] - server_before["commands"]) / total
              if total else None}
    result = {
        "rate": s.reliable_rate, "seconds": s.reliable_seconds, "consumers": s.reliable_consumers,
        "visibility_timeout_s": s.reliable_vt_s, "count": total, "offered": len(due), "delivered": len(first),
        "lost": sum(1 for i in due if i not in first and i not in still_queued),
        "undelivered_still_queued": sum(1 for i in due if i not in first and i in still_queued),
        "pending_left": pending_left, "duplicates": receipts - len(first),
        "unexpected": sum(1 for i in first if i not in due),
        "redelivered": sum(r["redelivered"] for r in results), "ack_false": sum(r["ack_false"] for r in results),
        "in_flight_left": in_flight_left, "producer_clamped": clamped, "elapsed_s": elapsed,
        "lateness_ms": summary, "late_over_5ms": sum(1 for v in lat if v > 5),
        "late_over_50ms": sum(1 for v in lat if v > 50), "histogram": log_histogram(lat),
        "ping": {"raw_p50_ms": percentile(raw_sorted, 50), "raw_p99_ms": percentile(raw_sorted, 99),
                 "client_p50_ms": percentile(idle_sorted, 50), "client_p99_ms": percentile(idle_sorted, 99),
                 "during_client_p50_ms": percentile(during_sorted, 50),
                 "during_client_p99_ms": percentile(during_sorted, 99),
                 "during_client_max_ms": during_sorted[-1] if during_sorted else None,
                 "during_samples": len(during_sorted)},
        "load": {"loadavg_before": list(load_before), "loadavg_after": list(load_after),
                 "cpu_busy_pct": busy, "nproc": os.cpu_count()},
        "server": server, "timeline": timeline,
        "per_consumer": [{"received": len(r["ids"]), "cpu_s": r["cpu_s"], "transfers": r["stats"]["transfers"],
                          "moved": r["stats"]["moved"], "transfer_errors": r["stats"]["transfer_errors"]}
                         for r in results],
    }
    p = result["ping"]
    log(f"    ours     : delivered {len(first):,}/{total:,} to {len(results)} processes "
        f"({', '.join(str(c['received']) for c in result['per_consumer'])}), lost {result['lost']}, "
        f"undelivered within the bound but still queued {result['undelivered_still_queued']}, "
        f"duplicates {result['duplicates']}; lateness p50={fmt_ms(summary['p50'])} p99={fmt_ms(summary['p99'])} "
        f"max={fmt_ms(summary['max'])}")
    log(f"      PING raw p50 {fmt_ms(p['raw_p50_ms'])}, redis.asyncio p50 {fmt_ms(p['client_p50_ms'])} before / "
        f"{fmt_ms(p['during_client_p50_ms'])} (p99 {fmt_ms(p['during_client_p99_ms'])}) during; load "
        f"{load_before[0]:.2f} -> {load_after[0]:.2f} (1 min), CPU busy {fmt_pct(busy)} of {os.cpu_count()} CPUs")
    log(f"      server: {server['cpu_s']:.2f} CPU s, {server['commands_per_item']:.1f} commands and "
        f"{server['evalsha_per_item']:.2f} script calls per item; per due second p50/p99/max ms: "
        + ", ".join(f"{t['p50']:.1f}/{t['p99']:.1f}/{t['max']:.1f}" for t in timeline))
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
