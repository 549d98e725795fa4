"""Scenario ``keys``: what keys cost: keyed ``offer()`` and the transfer of a keyed backlog against the
same without keys, and the server time of every keyed call with many keyed items pending."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from _harness import FAR_S, Bench, SlowLog, alternate, concurrent_rate, fill, log, payload, ratio
from redis.asyncio import Redis

from aiodelayq import DelayedQueue
from aiodelayq.testing import ThrowawayServer, find_server_kinds, server_banner, server_version

from .transfer import transfer_ours


async def run(bench: Bench) -> dict[str, Any]:
    """(A) ``offer_callers`` tasks, each awaiting one ``offer()`` at a time for ``offer_seconds``: without
    keys, with a new key per item, with it and ``dedupe_for``, and without keys with the event stream on;
    items/s. (B) ``keys_transfer_n`` items due 0.5 s after their ``offer_many``, without and with keys,
    moved as in ``transfer``; items/s. Both over ``keys_rounds`` rounds after a discarded warm-up, in turn
    (reversed every other round): ratios of the medians. (C) ``keys_pending_n`` keyed items pending, then
    2,000 calls each of ``get``, ``reschedule``, ``cancel`` and a keyed ``offer()`` on random keys: calls
    over 1 ms of server time (``SLOWLOG``) and the mean (``INFO commandstats``). All three on the run's
    server and, when that is a libc malloc build and a jemalloc one is installed, on a jemalloc server
    too, where the bars are judged: Redis ships with jemalloc, and keys cost allocations."""
    s = bench.sizes
    out: dict[str, Any] = {"callers": s.offer_callers, "transfer_n": s.keys_transfer_n,
                           "pending_n": s.keys_pending_n, "rounds": s.keys_rounds}
    out.update(await _measure(bench, bench.url, bench.ctl, bench.slowlog))
    # Again on a jemalloc build when the run's server is a libc malloc build this run started.
    kind = None if out["allocator"].startswith("jemalloc") or not bench.server.owned else next(
        (k for k in find_server_kinds() if "malloc=jemalloc" in server_banner(k.binary)), None)
    if kind is not None:
        log(f"    again on {kind.name} (jemalloc), as Redis and Valkey ship")
        with ThrowawayServer(kind) as srv:
            ctl = Redis.from_url(srv.url)
            try:
                slowlog = SlowLog(ctl, True)
                await slowlog.setup()
                out["jemalloc"] = await _measure(bench, srv.url, ctl, slowlog)
                out["jemalloc"]["server"] = f"{kind.name} (v{server_version(kind.binary)})"
            finally:
                await ctl.aclose()
    return out


async def _measure(bench: Bench, url: str, ctl: Redis, slowlog: SlowLog) -> dict[str, Any]:
    """(A), (B) and (C) on the server at ``url`` (``ctl`` is a client of it)."""
    s = bench.sizes
    allocator = str((await ctl.info("memory")).get("mem_allocator", "?"))
    log(f"    on a {allocator} build")
    out: dict[str, Any] = {"allocator": allocator}
    for what, rate, variants in (("offer", _offer_rate, ("unkeyed", "keyed", "windowed", "events")),
                                 ("transfer", _transfer_rate, ("unkeyed", "keyed"))):
        async def measure(variant: str, rate: Any = rate) -> float:
            return await rate(bench, url, ctl, variant)

        for variant in variants:  # a warm-up, discarded: the first large fills grow the heap
            log(f"    {what} warm-up {variant:8}: {await measure(variant):,.0f} items/s")
        out[what] = await alternate(variants, s.keys_rounds, measure, "items_per_s", flip=True, label=f"{what} ")
        out[what]["ratio"] = ratio(out[what]["keyed"]["items_per_s"], out[what]["unkeyed"]["items_per_s"])
    o = out["offer"]
    o["windowed_ratio"] = ratio(o["windowed"]["items_per_s"], o["keyed"]["items_per_s"])
    o["events_ratio"] = ratio(o["events"]["items_per_s"], o["unkeyed"]["items_per_s"])
    out["calls"] = await _call_times(bench, url, ctl, slowlog, s.keys_pending_n)
    return out


async def _offer_rate(bench: Bench, url: str, ctl: Redis, variant: str) -> float:
    """``unkeyed``, ``keyed`` (a new key per item), ``windowed`` (keyed, with ``dedupe_for`` 1 h) or ``events``
    (unkeyed, the event stream on: an event per offer)."""
    s = bench.sizes
    options = {"windowed": {"dedupe_for": 3600}}.get(variant, {})
    async with bench.fresh_queue("keys-offer", variant, url=url, ctl=ctl) as (client, name):
        q: DelayedQueue[Any] = DelayedQueue(client, name)
        await q.offer(payload(-1), FAR_S, key="warm-up")  # both scripts loaded, connection open
        await q.set_events(10_000_000 if variant == "events" else None)

        async def offer(i: int) -> None:
            await q.offer(payload(i), FAR_S, key=f"order-{i}" if variant in ("keyed", "windowed") else None, **options)

        return await concurrent_rate(offer, s.offer_callers, s.offer_seconds)


async def _transfer_rate(bench: Bench, url: str, ctl: Redis, variant: str) -> float:
    result = await transfer_ours(bench, bench.sizes.keys_transfer_n, url=url, ctl=ctl, keyed=variant == "keyed",
                                 in_order=True)
    return float(result["items_per_s"])


async def _call_times(bench: Bench, url: str, ctl: Redis, slowlog: SlowLog, n: int) -> dict[str, Any]:
    """(C): per call, its count, calls over 1 ms, the worst and the mean (ms of server time)."""
    async with bench.fresh_queue("keys-calls", "keyed", url=url, ctl=ctl) as (client, name):
        q: DelayedQueue[Any] = DelayedQueue(client, name)
        await fill(q, n, FAR_S, batch=10_000, keyed=True)
        picks = [bench.rng.randrange(n) for _ in range(2000)]
        calls: dict[str, Callable[[int], Awaitable[Any]]] = {
            "get": lambda i: q.get(f"order-{i}"), "reschedule": lambda i: q.reschedule(f"order-{i}", FAR_S + 60),
            "cancel": lambda i: q.cancel(f"order-{i}"), "offer": lambda i: q.offer(payload(i), FAR_S, key=f"order-{i}")}
        out: dict[str, Any] = {}
        for call, one in calls.items():
            await slowlog.begin(1000)  # only calls over 1 ms logged
            for i in picks:
                await one(i)
            over = await slowlog.end(lambda a: a[0].upper() == b"EVALSHA")
            stats = (await ctl.info("commandstats")).get("cmdstat_evalsha", {}) if over is not None else {}
            out[call] = {"calls": len(picks), "over_1ms": None if over is None else len(over),
                         "max_ms": max(over, default=0.0) if over is not None else None,
                         "mean_ms": stats.get("usec_per_call", 0) / 1000 or None}
        return out
