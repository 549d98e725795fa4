"""Scenario ``pending_10m``: ten million pending items on one server (run only when named)."""

from __future__ import annotations

import time
from typing import Any

from _harness import Bench, log, payload, ratio, until

from aiodelayq import DelayedQueue
from scenarios.transfer import transfer_ours

FAR_LO_S, FAR_HI_S = 3600.0, 86_400.0  # the far items' delays: due in 1 to 24 h, in random order
SLOW_MS, STALL_MS = 5.0, 30.0  # a script over SLOW_MS holds every other client; over STALL_MS it is a stall
TIER_AFTER_S = 3600.0  # the ours_tiered variant's horizon: every far item waits in the tier
VARIANTS = (("ours", None), ("ours_tiered", TIER_AFTER_S))


async def _used(bench: Bench) -> int:
    return int((await bench.ctl.info("memory"))["used_memory"])


async def _slow_calls(bench: Bench, window: str) -> dict[str, Any]:
    """The ``EVALSHA`` calls since :meth:`SlowLog.begin`: how many, how many over ``SLOW_MS`` and
    ``STALL_MS``, the slowest."""
    info = await bench.ctl.info("commandstats")
    calls = sum(int(v["calls"]) for k, v in info.items() if k in ("cmdstat_evalsha", "cmdstat_eval", "cmdstat_fcall"))
    times = await bench.slowlog.end(lambda a: a[0] in (b"EVALSHA", b"EVAL", b"FCALL")) or []
    over = sum(t > SLOW_MS for t in times)
    out = {"calls": calls, "over_5ms": over, "over_30ms": sum(t > STALL_MS for t in times),
           "share_over_5ms": over / calls if calls else None, "max_ms": max(times, default=None)}
    return out


async def run(bench: Bench) -> dict[str, Any]:
    """``scale_items`` pending items in one queue, ``scale_due`` of them (every tenth) due at once, the
    rest due in 1 to 24 h in random order; filled with ``offer_many`` in calls of ``offer_many_batch``
    items by one caller; twice: ``ours`` (every item in the timeout zset) and ``ours_tiered``
    (``tier_after_s`` of 1 h: every far item in the tier's bucket lists). Measures, for each, the fill
    rate of each tenth of the items (the last against the first), the server's memory per item
    (``used_memory`` before and after; at ``memory_items`` and at the end), the rate at which a queue
    opened afterwards moves the due items to the destination list against that of a ``scale_ref_backlog``
    backlog alone (:func:`~scenarios.transfer.transfer_ours`), and the script calls over 5 and 30 ms
    (``SLOWLOG``) during the fill and the move. Wants a jemalloc build (Debian's ``redis-server``:
    ``--server-kind system``)."""
    s = bench.sizes
    allocator = str((await bench.ctl.info("memory")).get("mem_allocator", "?"))
    out: dict[str, Any] = {"items": s.scale_items, "due": s.scale_due, "batch": s.offer_many_batch,
                           "mem_allocator": allocator, "tier_after_s": TIER_AFTER_S}
    for impl, tier_after_s in VARIANTS:
        # What earlier UNLINKs left to the server's background thread is freed first: used_memory before a
        # fill is then the true baseline.
        await until(lambda: bench.ctl.info("memory"), lambda i: not int(i.get("lazyfree_pending_objects", 0)), 120, 0.1)
        out[impl] = await _variant(bench, impl, tier_after_s)
    alone = await transfer_ours(bench, s.scale_ref_backlog)
    for impl, _ in VARIANTS:
        move = out[impl]["move"]
        move.update(alone_items_per_s=alone["items_per_s"], alone_backlog=s.scale_ref_backlog,
                    ratio=ratio(move["items_per_s"], alone["items_per_s"]))
    return out


async def _variant(bench: Bench, impl: str, tier_after_s: float | None) -> dict[str, Any]:
    """One fill, memory reading and move of :func:`run`, with ``tier_after_s`` (``None``: no tier)."""
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
        counts = await q.counts()
        out["memory"] = {"bytes_per_item": used, "bytes_per_item_at_memory_items": used_small,
                         "memory_items": s.memory_items, "element_bytes": len(head[0]) if head else 0,
                         "encoding": str(await bench.ctl.object("encoding", keys.timeout_set), "ascii"),
                         "tiered": counts.tiered, "in_zset": int(await bench.ctl.zcard(keys.timeout_set)),
                         "buckets": int(await bench.ctl.zcard(keys.tier_index))}
        if counts.pending != n:
            raise RuntimeError(f"pending_10m {impl}: {counts.pending:,} pending, expected {n:,}")
        await bench.slowlog.begin(int(SLOW_MS * 1000))
        t0 = time.perf_counter()
        async with DelayedQueue(consumer, name):
            if not await until(lambda: bench.ctl.llen(keys.destination), lambda n: n >= s.scale_due, 600, 0.005):
                raise RuntimeError("pending_10m: the due items were not moved within 600 s")
            moved_rate = s.scale_due / (time.perf_counter() - t0)
        slow = await _slow_calls(bench, "move")
        out["move"] = {"items_per_s": moved_rate, "slow": slow}
        await q.clear()  # the tier's buckets too (fresh_queue deletes the queue's fixed keys)
    return out
