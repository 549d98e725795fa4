"""Scenario ``memory``: server memory per pending item."""

from __future__ import annotations

from typing import Any

from _harness import FAR_S, Bench, log, payload, ratio
from reference import ReferenceQueue

from aiodelayq import DelayedQueue


async def run(bench: Bench) -> dict[str, Any]:
    """``memory_items`` pending items (the same payloads, delay 1 h): ``MEMORY USAGE key SAMPLES 0`` of the
    zset and the insertion-order list, per item. Ours (fast mode, zset only), the reference (zset +
    list, Redisson's layout) and, for information, ours with ``strict=True``."""
    n = bench.sizes.memory_items
    out: dict[str, Any] = {"items": n}
    for impl in ("ours", "reference", "ours_strict"):
        async with bench.fresh_queue("memory", impl) as (client, name):
            if impl == "reference":
                ref = await ReferenceQueue(client, name).prepare()
                for b in range(0, n, 1000):
                    await ref.offer_pipeline((payload(i), FAR_S) for i in range(b, min(n, b + 1000)))
            else:
                q: DelayedQueue[Any] = DelayedQueue(client, name, strict=impl == "ours_strict")
                for b in range(0, n, 10_000):
                    await q.offer_many([(payload(i), FAR_S) for i in range(b, min(n, b + 10_000))])
            keys = DelayedQueue(bench.ctl, name).keys
            zset = await bench.ctl.memory_usage(keys.timeout_set, samples=0) or 0
            lst = await bench.ctl.memory_usage(keys.delay_list, samples=0) or 0
            count = await bench.ctl.zcard(keys.timeout_set)
            out[impl] = {"zset_bytes": zset, "list_bytes": lst, "items": count,
                         "bytes_per_item": (zset + lst) / count if count else None}
            log(f"    {impl:11}: {count:,} items, zset {zset / 2**20:.1f} MiB + list {lst / 2**20:.1f} MiB = "
                f"{out[impl]['bytes_per_item']:.1f} B/item")
    out["ratio"] = ratio(out["ours"]["bytes_per_item"], out["reference"]["bytes_per_item"])
    return out
