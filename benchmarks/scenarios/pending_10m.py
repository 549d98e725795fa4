"""Scenario ``pending_10m``: ten million pending items on one server (run only when named)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from _harness import Bench, log, payload, ratio

from aiodelayq import DelayedQueue
from scenarios.transfer import transfer_ours

FAR_LO_S, FAR_HI_S = 3600.0, 86_400.0  # the far items' delays: due in 1 to 24 h, in random order
SLOW_MS, STALL_MS = 5.0, 30.0  # a script over SLOW_MS holds every other client; over STALL_MS it is a stall
TIER_AFTER_S = 3600.0  # the ours_tiered variant's horizon: every far item waits in the tier
VARIANTS = (("ours", None), ("ours_tiered", TIER_AFTER_S))


def _jemalloc_class(size: int) -> int:
    """The jemalloc size class ``size`` bytes take (small classes: 8, 16, then 4 per doubling)."""
    if size <= 8:
        return 8
    if size <= 16:
        return 16
    if size <= 64:
        return (size + 15) // 16 * 16
    step = 1 << (size - 1).bit_length() - 3
    return (size + step - 1) // step * step


def breakdown(element_len: int, items: int) -> dict[str, float]:
    """Where each byte of one pending item goes, bytes per item, by Redis 7.0's zset (skiplist + dict,
    the member's sds shared by both) and jemalloc's size classes. ``element``: the sds of the member
    (header, bytes, terminator); ``skiplist_node``: ``ele``, ``score``, ``backward`` and 16 bytes per
    level (levels with p = 1/4, at most 32); ``dict_entry``: key, value, next; ``dict_table``: 8 bytes a
    bucket over a power-of-two table."""
    sds = _jemalloc_class(3 + element_len + 1)
    node, p_level = 0.0, 0.75
    for level in range(1, 33):
        node += p_level * _jemalloc_class(24 + 16 * level)
        p_level *= 0.25
    table = 8 * (1 << max(2, (items - 1).bit_length())) / items
    return {"element": float(sds), "skiplist_node": node, "dict_entry": float(_jemalloc_class(24)),
            "dict_table": table, "total": sds + node + _jemalloc_class(24) + table}


def tier_breakdown(element_len: int, tiered: int, zset_items: int) -> dict[str, float]:
    """Where each byte of one pending item goes, bytes per item, when ``tiered`` of the items wait in
    the tier's bucket lists and ``zset_items`` in the zset (:func:`breakdown`). A tier entry is a
    listpack string of the 2-byte offset and the element: its encoding's length header (1 byte under 64
    bytes, 2 under 4,096), the bytes, and the back-length (1 byte under 128 in all, 2 under 16,384);
    quicklist nodes of 8 KiB listpacks (``list-max-listpack-size -2``) add their 32-byte node and the
    unused tail of each listpack, a few bytes per node."""
    string = 2 + element_len
    entry = (1 if string < 64 else 2) + string + (1 if string + 2 < 128 else 2)
    per_node = max(1, (8192 - 7) // entry)
    node = (_jemalloc_class(32) + 8192 - 7 - per_node * entry) / per_node
    items = tiered + zset_items
    zset = breakdown(element_len, max(1, zset_items))["total"]
    tier_item = entry + node
    return {"tier_entry": float(entry), "tier_node": node, "tier_item": tier_item, "zset_item": zset,
            "tiered_share": tiered / items if items else 0.0,
            "total": (tiered * tier_item + zset_items * zset) / items if items else 0.0}


async def _used(bench: Bench) -> int:
    return int((await bench.ctl.info("memory"))["used_memory"])


async def _freed(bench: Bench) -> None:
    """Wait until the server has freed what earlier ``UNLINK``s left to its background thread, so that
    ``used_memory`` before a fill is the true baseline (at most 120 s)."""
    for _ in range(1200):
        if int((await bench.ctl.info("memory")).get("lazyfree_pending_objects", 0)) == 0:
            return
        await asyncio.sleep(0.1)


async def _slow_calls(bench: Bench, window: str) -> dict[str, Any]:
    """The ``EVALSHA`` calls since :meth:`SlowLog.begin`: how many, how many over ``SLOW_MS`` and
    ``STALL_MS``, the slowest."""
    info = await bench.ctl.info("commandstats")
    calls = sum(int(v["calls"]) for k, v in info.items() if k in ("cmdstat_evalsha", "cmdstat_eval", "cmdstat_fcall"))
    times = await bench.slowlog.end(lambda a: a[0] in (b"EVALSHA", b"EVAL", b"FCALL")) or []
    over = sum(t > SLOW_MS for t in times)
    out = {"calls": calls, "over_5ms": over, "over_30ms": sum(t > STALL_MS for t in times),
           "share_over_5ms": over / calls if calls else None, "max_ms": max(times, default=None)}
    log(f"    {window}: {calls:,} script calls, {over:,} over {SLOW_MS:g} ms "
        f"({100 * (out['share_over_5ms'] or 0):.2f}%), {out['over_30ms']} over {STALL_MS:g} ms, slowest "
        f"{out['max_ms'] or 0:.1f} ms")
    return out


async def run(bench: Bench) -> dict[str, Any]:
    """``scale_items`` pending items in one queue, ``scale_due`` of them (every tenth) due at once, the
    rest due in 1 to 24 h in random order; filled with ``offer_many`` in calls of ``offer_many_batch``
    items by one caller; twice: ``ours`` (every item in the timeout zset) and ``ours_tiered``
    (``tier_after_s`` of 1 h: every far item in the tier's bucket lists). Measures, for each, the fill
    rate of each tenth of the items (the last against the first), the server's memory per item
    (``used_memory`` before and after; at ``memory_items`` and at the end) against a model of where
    each byte goes, the rate at which a queue opened afterwards moves the due items to the destination
    list against that of a ``scale_ref_backlog`` backlog alone (:func:`~scenarios.transfer.transfer_ours`),
    and the script calls over 5 and 30 ms (``SLOWLOG``) during the fill and the move. Wants a jemalloc
    build (Debian's ``redis-server``: ``--server-kind system``)."""
    s = bench.sizes
    allocator = str((await bench.ctl.info("memory")).get("mem_allocator", "?"))
    out: dict[str, Any] = {"items": s.scale_items, "due": s.scale_due, "batch": s.offer_many_batch,
                           "mem_allocator": allocator, "tier_after_s": TIER_AFTER_S}
    log(f"    {s.scale_items:,} items ({s.scale_due:,} due), offer_many of {s.offer_many_batch:,}, allocator "
        f"{allocator}")
    for impl, tier_after_s in VARIANTS:
        await _freed(bench)
        log(f"    {impl}:")
        out[impl] = await _variant(bench, impl, tier_after_s)
    alone = await transfer_ours(bench, s.scale_ref_backlog)
    for impl, _ in VARIANTS:
        move = out[impl]["move"]
        move.update(alone_items_per_s=alone["items_per_s"], alone_backlog=s.scale_ref_backlog,
                    ratio=ratio(move["items_per_s"], alone["items_per_s"]))
        log(f"    {impl}: move ratio to a {s.scale_ref_backlog:,} backlog alone: {move['ratio']:.2f}")
    return out


async def _variant(bench: Bench, impl: str, tier_after_s: float | None) -> dict[str, Any]:
    """One fill, memory reading and move of :func:`run`, with ``tier_after_s`` (``None``: no tier)."""
    s = bench.sizes
    n, due_every, batch = s.scale_items, s.scale_items // s.scale_due, s.offer_many_batch
    out: dict[str, Any] = {"tier_after_s": tier_after_s}
    async with bench.fresh_queue("pending_10m", impl) as (client, name):
        q: DelayedQueue[Any] = DelayedQueue(client, name, tier_after_s=tier_after_s)
        keys = q.keys
        tenth = n // 10
        rates: list[float] = []
        used0 = await _used(bench)
        used_small: float | None = None
        await bench.slowlog.begin(int(SLOW_MS * 1000))
        t_part = time.perf_counter()
        for b in range(0, n, batch):
            ids = range(b, min(n, b + batch))
            await q.offer_many([(payload(i), 0.0 if i % due_every == 0 else
                                 FAR_LO_S + bench.rng.random() * (FAR_HI_S - FAR_LO_S)) for i in ids])
            done = b + len(ids)
            if used_small is None and done >= s.memory_items:
                used_small = (await _used(bench) - used0) / done
            if done % tenth == 0:
                rates.append(tenth / (time.perf_counter() - t_part))
                log(f"    {done:>12,} pending: {rates[-1]:,.0f} items/s")
                t_part = time.perf_counter()
        out["fill"] = {"items_per_s_by_tenth": rates, "last_over_first": ratio(rates[-1], rates[0]),
                       "slow": await _slow_calls(bench, "fill")}
        used = (await _used(bench) - used0) / n
        head = await bench.ctl.zrange(keys.timeout_set, -1, -1)
        element_len = len(head[0]) if head else 0
        counts = await q.counts()
        in_zset = int(await bench.ctl.zcard(keys.timeout_set))
        model = (breakdown(element_len, n) if tier_after_s is None
                 else tier_breakdown(element_len, counts.tiered, in_zset))
        out["memory"] = {"bytes_per_item": used, "bytes_per_item_at_memory_items": used_small,
                         "memory_items": s.memory_items, "element_bytes": element_len,
                         "encoding": str(await bench.ctl.object("encoding", keys.timeout_set), "ascii"),
                         "tiered": counts.tiered, "in_zset": in_zset,
                         "buckets": int(await bench.ctl.zcard(keys.tier_index)), "model": model}
        log(f"    memory: {used:.1f} B/item at {n:,} ({used_small or 0:.1f} at {s.memory_items:,}); element "
            f"{element_len} B; {counts.tiered:,} tiered in {out['memory']['buckets']:,} buckets, {in_zset:,} in "
            f"the zset; model {model}")
        if counts.pending != n:
            raise RuntimeError(f"pending_10m {impl}: {counts.pending:,} pending, expected {n:,}")
        consumer = bench.client()
        try:
            cq: DelayedQueue[Any] = DelayedQueue(consumer, name)
            await bench.slowlog.begin(int(SLOW_MS * 1000))
            t0 = time.perf_counter()
            async with cq:
                while await bench.ctl.llen(keys.destination) < s.scale_due:
                    if time.perf_counter() - t0 > 600:
                        raise RuntimeError("pending_10m: the due items were not moved within 600 s")
                    await asyncio.sleep(0.005)
                elapsed = time.perf_counter() - t0
            moved_rate = s.scale_due / elapsed
            slow = await _slow_calls(bench, "move")
        finally:
            await consumer.aclose()
        log(f"    moved {s.scale_due:,} due items among {n:,} at {moved_rate:,.0f} items/s")
        out["move"] = {"items_per_s": moved_rate, "slow": slow}
        await q.clear()  # the tier's buckets too (fresh_queue deletes the queue's fixed keys)
    return out
