"""Scenario ``pending_10m``: ten million pending items on one server (run only when named)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from _harness import Bench, fill, log, payload, ratio, until

from aiodelayq import DelayedQueue

FAR_LO_S, FAR_HI_S = 86_400.0, 172_800.0  # the far items' delays: due in 1 to 2 days, in random order
SLOW_MS, STALL_MS = 5.0, 30.0  # a script over SLOW_MS holds every other client; over STALL_MS it is a stall
TIER_AFTER_S = 3600.0  # the ours_tiered variant's horizon: every far item waits in the tier
VARIANTS = (("ours", None), ("ours_tiered", TIER_AFTER_S))
FILL_RATE_BOUND = 50_000.0  # items/s: the due instant is set as if the fill went no faster
ALONE_DUE_S = 3.0  # the items alone fall due this long after their fill
DRAIN_BATCH = 1000


async def _used(bench: Bench) -> int:
    return int((await bench.ctl.info("memory"))["used_memory"])


async def _slow_calls(bench: Bench) -> dict[str, Any]:
    """Script calls since :meth:`SlowLog.begin`: how many, how many over ``SLOW_MS`` and ``STALL_MS``, the slowest."""
    info = await bench.ctl.info("commandstats")
    calls = sum(int(v["calls"]) for k, v in info.items() if k in ("cmdstat_evalsha", "cmdstat_eval", "cmdstat_fcall"))
    times = await bench.slowlog.end(lambda a: a[0] in (b"EVALSHA", b"EVAL", b"FCALL")) or []
    over = sum(t > SLOW_MS for t in times)
    return {"calls": calls, "over_5ms": over, "over_30ms": sum(t > STALL_MS for t in times),
            "share_over_5ms": over / calls if calls else None, "max_ms": max(times, default=None)}


async def run(bench: Bench) -> dict[str, Any]:
    """``scale_items`` pending items in one queue, ``scale_due`` of them (every tenth) due at one instant
    after the fill ends, the rest due in 1 to 2 days in random order; filled with ``offer_many`` in calls
    of ``offer_many_batch`` items by one caller; twice: ``ours`` (every item in the timeout zset) and
    ``ours_tiered`` (``tier_after_s`` of 1 h: every far item in the tier's bucket lists). Measures, for
    each, the fill rate of each tenth of the items (the last against the first), the server's memory per
    item (``used_memory`` before and after; at ``memory_items`` and at the end), and, once the due items
    have fallen due, one queue object opened afterwards draining them with ``take_many(1000)``: the rate
    at which its transfer moves them out of the zset (the move) and the rate at which it takes them (the
    drain), each from the open, against the same ``scale_due`` items alone in a queue of the same options
    (due 3 s after their fill); the server's µs per due element reading them by itself (``ZRANGE`` of
    1,000 ranks at a time, before the drain), among the rest and alone; and the script calls over 5 and
    30 ms (``SLOWLOG``) during the fill and the drain. Wants a jemalloc build (Debian's ``redis-server``:
    ``--server-kind system``)."""
    s = bench.sizes
    allocator = str((await bench.ctl.info("memory")).get("mem_allocator", "?"))
    out: dict[str, Any] = {"items": s.scale_items, "due": s.scale_due, "batch": s.offer_many_batch,
                           "mem_allocator": allocator, "tier_after_s": TIER_AFTER_S}
    for impl, tier_after_s in VARIANTS:
        # What earlier UNLINKs left to the server's background thread is freed first: used_memory before a
        # fill is then the true baseline.
        await _freed(bench)
        out[impl] = await _variant(bench, impl, tier_after_s)
        await _freed(bench)
        alone = await _alone(bench, tier_after_s)
        for part in ("move", "drain"):
            got = out[impl][part]
            got.update(alone_items_per_s=alone[part]["items_per_s"],
                       ratio=ratio(got["items_per_s"], alone[part]["items_per_s"]))
        out[impl]["drain"]["alone_server_read_us_per_item"] = alone["drain"]["server_read_us_per_item"]
    return out


async def _server_us(bench: Bench) -> dict[str, int]:
    """µs the server spent so far (since the last ``CONFIG RESETSTAT``) in scripts and in ZADD."""
    info = await bench.ctl.info("commandstats")
    return {"scripts": sum(int(v["usec"]) for k, v in info.items() if k in ("cmdstat_evalsha", "cmdstat_eval")),
            "zadd": int(info.get("cmdstat_zadd", {}).get("usec", 0))}


async def _freed(bench: Bench) -> None:
    await until(lambda: bench.ctl.info("memory"), lambda i: not int(i.get("lazyfree_pending_objects", 0)), 120, 0.1)


async def _drain(bench: Bench, consumer: Any, name: str, tier_after_s: float | None, due: int,
                 due_ms: float) -> dict[str, Any]:
    """Once ``due_ms`` (server ms) has come: open a queue object on ``name`` and take ``due`` items with
    ``take_many(1000)``; the move (until its transfers moved them all, by its own counters: no call in the
    timed loop) and the drain (until the last item), items/s from the open, and the script calls over 5
    and 30 ms meanwhile."""
    await asyncio.sleep(max(0.0, (due_ms - bench.server_now_ms()) / 1000.0 + 0.05))
    keys = DelayedQueue(consumer, name).keys
    # The server alone reading the due elements, a window of ranks at a time: its µs per element, which
    # the zset's size and where its nodes lie in memory set, not the library.
    await bench.ctl.config_resetstat()
    for first in range(0, due, DRAIN_BATCH):
        await bench.ctl.zrange(keys.timeout_set, first, first + DRAIN_BATCH - 1)
    read_us = int((await bench.ctl.info("commandstats")).get("cmdstat_zrange", {}).get("usec", 0)) / due
    await bench.slowlog.begin(int(SLOW_MS * 1000))
    moved_s: float | None = None
    got = 0
    t0 = time.perf_counter()
    async with DelayedQueue(consumer, name, tier_after_s=tier_after_s) as q:
        while got < due:
            got += len(await q.take_many(DRAIN_BATCH, timeout=60.0))
            if moved_s is None and q.stats.moved >= due:
                moved_s = time.perf_counter() - t0
            if time.perf_counter() - t0 > 600:
                raise RuntimeError(f"pending_10m: {got:,} of {due:,} due items taken within 600 s")
        drained_s = time.perf_counter() - t0
    slow = await _slow_calls(bench)
    moved_s = moved_s or drained_s
    return {"move": {"items_per_s": due / moved_s},
            "drain": {"items_per_s": due / drained_s, "slow": slow, "server_read_us_per_item": read_us}}


async def _alone(bench: Bench, tier_after_s: float | None) -> dict[str, Any]:
    """The ``scale_due`` items alone in a queue (``tier_after_s`` as the variant's), each due 3 s after its
    ``offer_many`` call, drained as :func:`_drain` once the last is due."""
    s = bench.sizes
    async with bench.fresh_queue("pending_10m", "alone", clients=2) as (client, consumer, name):
        q: DelayedQueue[Any] = DelayedQueue(client, name, tier_after_s=tier_after_s)
        dues = await fill(q, s.scale_due, ALONE_DUE_S, batch=s.offer_many_batch)
        return await _drain(bench, consumer, name, tier_after_s, s.scale_due, float(max(dues)))


async def _variant(bench: Bench, impl: str, tier_after_s: float | None) -> dict[str, Any]:
    """One fill, memory reading and drain of :func:`run`, with ``tier_after_s`` (``None``: no tier)."""
    s = bench.sizes
    n, due_every, batch = s.scale_items, s.scale_items // s.scale_due, s.offer_many_batch
    out: dict[str, Any] = {"tier_after_s": tier_after_s}
    async with bench.fresh_queue("pending_10m", impl, clients=2) as (client, consumer, name):
        q: DelayedQueue[Any] = DelayedQueue(client, name, tier_after_s=tier_after_s)
        keys = q.keys
        tenth = n // 10
        rates: list[float] = []
        used0 = await _used(bench)
        used_small: float | None = None
        # The due instant: after the fill at a pessimistic rate (a later one only makes the drain wait).
        due_ms = bench.server_now_ms() + n / FILL_RATE_BOUND * 1000.0
        await bench.slowlog.begin(int(SLOW_MS * 1000))
        t_part = time.perf_counter()
        stats = [await _server_us(bench)]  # at each tenth: the scripts' and their ZADDs' server time so far
        for b in range(0, n, batch):
            ids = range(b, min(n, b + batch))
            now_ms = bench.server_now_ms()
            await q.offer_many([(payload(i), max(0.0, (due_ms - now_ms) / 1000.0) if i % due_every == 0 else
                                 FAR_LO_S + bench.rng.random() * (FAR_HI_S - FAR_LO_S)) for i in ids])
            done = b + len(ids)
            if used_small is None and done >= s.memory_items:
                used_small = (await _used(bench) - used0) / done
            if done % tenth == 0:
                rates.append(tenth / (time.perf_counter() - t_part))
                log(f"    {done:>12,} pending: {rates[-1]:,.0f} items/s")
                stats.append(await _server_us(bench))
                t_part = time.perf_counter()
        # Server µs per item offered in the first and the last tenth: OFFER in all, and the ZADDs it ran
        # (the zset's insert: the server's own cost, which grows with the zset).
        per_item = {part: {k: (stats[i + 1][k] - stats[i][k]) / tenth for k in ("scripts", "zadd")}
                    for part, i in (("first", 0), ("last", len(stats) - 2))}
        out["fill"] = {"items_per_s_by_tenth": rates, "last_over_first": ratio(rates[-1], rates[0]),
                       "server_us_per_item": per_item,
                       "slow": await _slow_calls(bench), "ended_before_due": bench.server_now_ms() < due_ms}
        used = (await _used(bench) - used0) / n
        head = await bench.ctl.zrange(keys.timeout_set, -1, -1)
        counts = await q.counts()
        out["memory"] = {"bytes_per_item": used, "bytes_per_item_at_memory_items": used_small,
                         "memory_items": s.memory_items, "element_bytes": len(head[0]) if head else 0,
                         "encoding": str(await bench.ctl.object("encoding", keys.timeout_set), "ascii"),
                         "tiered": counts.tiered, "in_zset": int(await bench.ctl.zcard(keys.timeout_set)),
                         "buckets": int(await bench.ctl.zcard(keys.tier_index))}
        if counts.pending != n:
            raise RuntimeError(f"pending_10m {impl}: {counts.pending:,} pending, expected {n:,}")
        out.update(await _drain(bench, consumer, name, tier_after_s, s.scale_due, due_ms))
        await q.clear()  # the tier's buckets too (fresh_queue deletes the queue's fixed keys)
    return out
