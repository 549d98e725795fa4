"""Scenarios ``offer``, ``offer_many``, ``e2e`` and ``memory``: ours and the reference in this process, the
same calls on each, back to back."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

from _harness import FAR_S, Bench, concurrent_rate, evalsha_of, fill, paired, payload, ratio
from reference import ReferenceQueue, consuming

from aiodelayq import DelayedQueue


async def _queue(client: Any, name: str, impl: str, **kwargs: Any) -> Any:
    return DelayedQueue(client, name, **kwargs) if impl.startswith("ours") else \
        await ReferenceQueue(client, name).prepare()


async def offer(bench: Bench) -> dict[str, Any]:
    """``offer_callers`` tasks, each awaiting one offer at a time in a loop for ``offer_seconds`` (delay
    1 h, nothing falls due): completed offers per second. Ours: ``await q.offer()`` (the library
    coalesces concurrent offers); reference: one ``EVALSHA`` of Redisson's offer script per item, on
    redis-py's connection pool (up to one connection per caller)."""
    s = bench.sizes

    async def measure(impl: str) -> float:
        async with bench.fresh_queue("offer", impl) as (client, name):
            q = await _queue(client, name, impl)
            await q.offer(payload(0), FAR_S)  # warm-up: script load, connection
            return await concurrent_rate(lambda i: q.offer(payload(i), FAR_S), s.offer_callers, s.offer_seconds)

    return {"callers": s.offer_callers, "seconds": s.offer_seconds, **await paired(bench, measure, "items_per_s")}


async def offer_many(bench: Bench) -> dict[str, Any]:
    """``offer_many_items`` items in batches of ``offer_many_batch`` (delay 1 h), one batch at a time:
    items per second. Ours: ``await q.offer_many(batch)``; reference: a redis-py pipeline
    (``transaction=False``) of one offer script per item, one round trip per batch. The worst server
    time of one of our ``offer_many`` script calls comes from ``SLOWLOG``."""
    s = bench.sizes
    worst: list[float] = []
    batches = [[(payload(i), FAR_S) for i in range(b, min(b + s.offer_many_batch, s.offer_many_items))]
               for b in range(0, s.offer_many_items, s.offer_many_batch)]

    async def measure(impl: str) -> float:
        async with bench.fresh_queue("offer_many", impl) as (client, name):
            q = await _queue(client, name, impl)
            await q.offer(payload(0), FAR_S)
            if impl == "ours":
                await bench.slowlog.begin()
            t0 = time.perf_counter()
            for batch in batches:
                await q.offer_many(batch)
            elapsed = time.perf_counter() - t0
            if impl == "ours":
                worst.extend(await bench.slowlog.end(evalsha_of(DelayedQueue(bench.ctl, name).keys.channel)) or [])
            return s.offer_many_items / elapsed

    out = {"items": s.offer_many_items, "batch": s.offer_many_batch, **await paired(bench, measure, "items_per_s")}
    out["ours"]["worst_script_ms"] = max(worst, default=None)
    return out


async def e2e(bench: Bench) -> dict[str, Any]:
    """One process, two clients: a producer offers batches of 1000 items due at once (delay 0) while at
    most ``e2e_backlog`` are offered but not yet consumed; a consumer takes them (ours: ``take_many(1000)``
    on an opened queue; reference: its transfer task plus a ``BLPOP`` loop). msgs/s = items
    consumed during ``e2e_seconds`` / ``e2e_seconds``."""
    s = bench.sizes

    async def measure(impl: str) -> float:
        offered = consumed = 0
        stop = False
        async with bench.fresh_queue("e2e", impl, clients=2) as (producer, consumer, name), \
                contextlib.AsyncExitStack() as stack:
            q = await _queue(producer, name, impl)
            if impl == "ours":
                cq: DelayedQueue[Any] = await stack.enter_async_context(DelayedQueue(consumer, name))

                async def take() -> int:
                    return len(await cq.take_many(1000, timeout=0.2))
            else:
                ref = await stack.enter_async_context(consuming(consumer, name, q.shas))

                async def take() -> int:
                    return 0 if await ref.take(0.2) is None else 1

            async def produce() -> None:
                nonlocal offered
                while not stop:
                    if offered - consumed >= s.e2e_backlog:
                        await asyncio.sleep(0.001)
                        continue
                    await q.offer_many([(payload(j), 0) for j in range(offered, offered + 1000)])
                    offered += 1000

            async def consume() -> None:
                nonlocal consumed
                while not stop:
                    got = await take()
                    if not stop:
                        consumed += got

            tasks = [asyncio.ensure_future(produce()), asyncio.ensure_future(consume())]
            t0 = time.perf_counter()
            await asyncio.sleep(s.e2e_seconds)
            rate = consumed / (time.perf_counter() - t0)
            stop = True
            done, pending = await asyncio.wait(tasks, timeout=10.0)
            for task in pending:
                task.cancel()
            for task in done:
                if task.exception() is not None:
                    raise RuntimeError("e2e task failed") from task.exception()
            return rate

    return {"seconds": s.e2e_seconds, "backlog_cap": s.e2e_backlog, **await paired(bench, measure, "msgs_per_s")}


async def memory(bench: Bench) -> dict[str, Any]:
    """``memory_items`` pending items (the same payloads, delay 1 h): ``MEMORY USAGE key SAMPLES 0`` of the
    zset and the insertion-order list, per item. Ours (fast mode, zset only), the reference (zset +
    list, Redisson's layout) and, for information, ours with ``strict=True``."""
    n = bench.sizes.memory_items
    out: dict[str, Any] = {"items": n}
    for impl in ("ours", "reference", "ours_strict"):
        async with bench.fresh_queue("memory", impl) as (client, name):
            if impl == "reference":
                ref = await _queue(client, name, impl)
                for b in range(0, n, 1000):
                    await ref.offer_many((payload(i), FAR_S) for i in range(b, min(n, b + 1000)))
            else:
                await fill(await _queue(client, name, impl, strict=impl == "ours_strict"), n, FAR_S, batch=10_000)
            keys = DelayedQueue(bench.ctl, name).keys
            zset = await bench.ctl.memory_usage(keys.timeout_set, samples=0) or 0
            lst = await bench.ctl.memory_usage(keys.delay_list, samples=0) or 0
            count = await bench.ctl.zcard(keys.timeout_set)
            out[impl] = {"zset_bytes": zset, "list_bytes": lst, "items": count,
                         "bytes_per_item": (zset + lst) / count if count else None}
    out["ratio"] = ratio(out["ours"]["bytes_per_item"], out["reference"]["bytes_per_item"])
    return out
