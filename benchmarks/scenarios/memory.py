"""Scenario ``memory``: server memory per pending item."""

from __future__ import annotations

import statistics
from typing import Any

from _harness import FAR_S, Bench, log, payload
from reference import ReferenceQueue, encode_item

from aiodelayq import DelayedQueue


async def run(bench: Bench) -> dict[str, Any]:
    """``memory_items`` pending items (the same payloads, delay 1 h): ``MEMORY USAGE key SAMPLES 0`` of the
    zset and the insertion-order list, per item. Ours (fast mode, zset only), the reference (zset +
    list, Redisson's layout) and, for information, ours with ``strict=True``."""
    s = bench.sizes
    out: dict[str, Any] = {"items": s.memory_items}
    avg = statistics.fmean(len(encode_item(payload(i))) for i in range(0, s.memory_items, 97))
    out["payload_bytes_avg"] = avg
    for impl in ("ours", "reference", "ours_strict"):
        async with bench.fresh_queue("memory", impl) as (client, name):
            if impl == "reference":
                ref = await ReferenceQueue(client, name).prepare()
                for b in range(0, s.memory_items, 1000):
                    await ref.offer_pipeline((payload(i), FAR_S) for i in range(b, min(s.memory_items, b + 1000)))
            else:
                q: DelayedQueue[Any] = DelayedQueue(client, name, strict=impl == "ours_strict")
                for b in range(0, s.memory_items, 10_000):
                    await q.offer_many([(payload(i), FAR_S) for i in range(b, min(s.memory_items, b + 10_000))])
            keys = DelayedQueue(bench.ctl, name).keys
            zset = await bench.ctl.memory_usage(keys.timeout_set, samples=0) or 0
            lst = await bench.ctl.memory_usage(keys.delay_list, samples=0) or 0
            n = await bench.ctl.zcard(keys.timeout_set)
            out[impl] = {"zset_bytes": zset, "list_bytes": lst, "items": n,
                         "bytes_per_item": (zset + lst) / n if n else None}
            log(f"    {impl:11}: {n:,} items, zset {zset / 2**20:.1f} MiB + list {lst / 2**20:.1f} MiB = "
                f"{(zset + lst) / n:.1f} B/item")
    o, r = out["ours"]["bytes_per_item"], out["reference"]["bytes_per_item"]
    out["ratio"] = o / r if o and r else None
    return out
