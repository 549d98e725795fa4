"""Scenario ``transfer``: how fast a backlog of due items in random due order is moved."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from _harness import Bench, log, median, payload, stop_reference
from lateness import percentile
from redis.asyncio import Redis
from reference import ReferenceQueue, ReferenceSubscriber
from report import fmt_ms, fmt_num

from aiodelayq import DelayedQueue


async def run(bench: Bench) -> dict[str, Any]:
    """For each backlog N: N items pending in random due order, all due when the transfer starts.

    Ours: filled with ``offer_many`` (chunks of 10,000) with due times drawn uniformly from a 1 s window
    placed just after the expected end of the fill, then wait until the window has passed. Measured:
    from ``open()`` of a queue on another client (its first transfer runs at open, then back to back)
    until ``ZCARD`` of the zset is 0. Reference: filled with pipelines of 1000 Redisson offer scripts
    with due times drawn uniformly from the minute before the fill (the list is in insertion order, the
    zset in due order: the element due next sits anywhere in the list); measured from starting its
    transfer loop (subscribe -> transfer -> re-run while the next due time is past) until ``ZCARD`` is
    0, or for at most ``ref_bound_s`` seconds (then ``bounded``: the rate is moved / elapsed over the
    window). Worst single script time: ``SLOWLOG`` over the measured window."""
    s = bench.sizes
    out: dict[str, Any] = {"ns": list(s.transfer_ns), "ours": {}, "reference": {}, "ratio": {},
                           "ref_bound_s": s.ref_bound_s}
    fill_rate = (bench.results.get("offer_many") or {}).get("ours", {}).get("items_per_s") or 100_000.0
    for n in s.transfer_ns:
        rounds = s.rounds if n <= s.transfer_rounds_upto else 1
        runs: dict[str, list[dict[str, Any]]] = {"ours": [], "reference": []}
        for rnd in range(rounds):
            log(f"    N={n:,} round {rnd + 1}/{rounds}")
            runs["ours"].append(await _transfer_ours(bench, n, fill_rate))
            if rnd == 0 or not runs["reference"][-1]["bounded"]:
                runs["reference"].append(await _transfer_reference(bench, n))
        out["ours"][str(n)] = _merge_runs(runs["ours"])
        out["reference"][str(n)] = _merge_runs(runs["reference"])
        o, r = out["ours"][str(n)]["items_per_s"], out["reference"][str(n)]["items_per_s"]
        out["ratio"][str(n)] = o / r if o and r else None
    return out


async def _transfer_ours(bench: Bench, n: int, fill_rate: float) -> dict[str, Any]:
    name = bench.name("transfer", "ours")
    producer, consumer = bench.client(), bench.client()
    try:
        q: DelayedQueue[Any] = DelayedQueue(producer, name)
        keys = q.keys
        lead_ms = (1.5 * n / fill_rate + 0.3) * 1000.0
        lo = bench.server_now_ms() + lead_ms
        clamped = 0
        t_fill = time.perf_counter()
        next_print = t_fill + 2.0
        for b in range(0, n, 10_000):
            now = bench.server_now_ms()
            pairs = []
            for i in range(b, min(n, b + 10_000)):
                delay_ms = lo + bench.rng.random() * 1000.0 - now
                if delay_ms < 0:
                    clamped += 1
                    delay_ms = 0.0
                pairs.append((payload(i), delay_ms / 1000.0))
            await q.offer_many(pairs)
            if time.perf_counter() >= next_print:
                log(f"      ours fill: {b + len(pairs):,}/{n:,}")
                next_print += 2.0
        fill_s = time.perf_counter() - t_fill
        wait_s = max(0.0, (lo + 1000.0 + 20.0 - bench.server_now_ms()) / 1000.0)
        await asyncio.sleep(wait_s)
        pending = await bench.ctl.zcard(keys.timeout_set)
        if pending != n:
            raise RuntimeError(f"ours fill: zset {pending}, expected {n}")
        cq: DelayedQueue[Any] = DelayedQueue(consumer, name)
        await bench.slowlog.begin()
        t0 = time.perf_counter()
        await cq.open()
        elapsed, left = await wait_empty(bench, keys.timeout_set, t0, t0 + 600.0, "ours")
        emptied = left == 0
        stats = cq.stats
        await cq.aclose()
        times = await bench.slowlog.end(lambda a: a[0] == b"EVALSHA" and keys.dead_letter.encode() in a)
        ready = await bench.ctl.llen(keys.destination)
        result = {"items_per_s": n / elapsed if emptied else None, "elapsed_s": elapsed, "moved": ready,
                  "bounded": False, "worst_script_ms": max(times) if times else None,
                  "script_calls": stats.transfers, "fill_s": fill_s, "fill_clamped": clamped,
                  "waited_for_due_s": wait_s, "slowlog_calls": len(times) if times is not None else None,
                  "p50_script_ms": percentile(sorted(times), 50) if times else None}
        log(f"      ours     : moved {ready:,} in {elapsed:.2f} s = {n / elapsed:,.0f} items/s, "
            f"{stats.transfers} script calls, worst {fmt_ms(result['worst_script_ms'])} "
            f"(fill {fill_s:.1f} s, waited {wait_s:.1f} s for due)")
        return result
    finally:
        await producer.aclose()
        await consumer.aclose()
        await bench.drop(name)


async def _transfer_reference(bench: Bench, n: int) -> dict[str, Any]:
    name = bench.name("transfer", "reference")
    producer, consumer = bench.client(), bench.client()
    sub = None
    ref_c = None
    try:
        ref_p = await ReferenceQueue(producer, name).prepare()
        keys = ref_p.keys
        start = time.time() * 1000.0
        t_fill = time.perf_counter()
        next_print = t_fill + 2.0
        for b in range(0, n, 1000):
            await ref_p.offer_at_pipeline((payload(i), int(start - 1000.0 - bench.rng.random() * 60_000.0))
                                          for i in range(b, min(n, b + 1000)))
            if time.perf_counter() >= next_print:
                log(f"      reference fill: {b + 1000:,}/{n:,}")
                next_print += 2.0
        fill_s = time.perf_counter() - t_fill
        pending = await bench.ctl.zcard(keys.timeout_set)
        listed = await bench.ctl.llen(keys.delay_list)
        if (pending, listed) != (n, n):
            raise RuntimeError(f"reference fill: zset {pending}, list {listed}, expected {n}")
        ref_c = await ReferenceQueue(consumer, name).prepare(ref_p.shas)
        sub = ReferenceSubscriber(consumer)
        ref_c.start(sub)
        sha = ref_p.shas.transfer.encode()
        await bench.slowlog.begin()
        t0 = time.perf_counter()
        await sub.start()
        # The ZCARD that ends the window is served after the script in flight, so it counts that call.
        elapsed, left = await wait_empty(bench, keys.timeout_set, t0, t0 + bench.sizes.ref_bound_s, "reference")
        emptied = left == 0
        await ref_c.stop()
        times = await bench.slowlog.end(lambda a: a[0] == b"EVALSHA" and len(a) > 1 and a[1] == sha)
        moved = n - left
        rate = moved / elapsed if moved else None
        result = {"items_per_s": rate, "elapsed_s": elapsed, "moved": moved, "bounded": not emptied,
                  "worst_script_ms": max(times) if times else None, "script_calls": ref_c.stats.transfers,
                  "worst_client_rtt_ms": max(ref_c.stats.transfer_rtts_ms, default=None), "fill_s": fill_s,
                  "slowlog_calls": len(times) if times is not None else None,
                  "p50_script_ms": percentile(sorted(times), 50) if times else None,
                  "est_full_drain_s": n / rate if rate and not emptied else None}
        bounded = f" (BOUNDED at {bench.sizes.ref_bound_s:g} s: {moved:,} of {n:,})" if not emptied else ""
        log(f"      reference: moved {moved:,} in {elapsed:.2f} s = {fmt_num(rate)} items/s{bounded}, "
            f"{ref_c.stats.transfers} script calls, worst {fmt_ms(result['worst_script_ms'])} (fill {fill_s:.1f} s)")
        return result
    finally:
        await stop_reference(ref_c, sub)
        await producer.aclose()
        await consumer.aclose()
        await bench.drop(name)


async def wait_empty(bench: Bench, key: str, t0: float, deadline: float, label: str,
                     ctl: Redis | None = None) -> tuple[float, int]:
    """Poll ``ZCARD key`` every 2 ms (on ``ctl``, default the run's server) until 0 or ``deadline``;
    (seconds since ``t0``, last ZCARD)."""
    ctl = ctl or bench.ctl
    next_print = t0 + 2.0
    while True:
        n = await ctl.zcard(key)
        now = time.perf_counter()
        if n == 0 or now >= deadline:
            return now - t0, n
        if now >= next_print:
            log(f"      {label}: {now - t0:5.1f} s, {n:,} still pending")
            next_print += 2.0
        await asyncio.sleep(0.002)


def _merge_runs(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Median rate over the rounds; worst script time over all rounds."""
    rates = [r["items_per_s"] for r in runs if r["items_per_s"] is not None]
    worst = [r["worst_script_ms"] for r in runs if r["worst_script_ms"] is not None]
    return {"items_per_s": median(rates), "worst_script_ms": max(worst) if worst else None,
            "bounded": any(r["bounded"] for r in runs), "rounds": runs}
