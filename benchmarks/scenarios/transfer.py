"""Scenario ``transfer``: how fast a backlog of due items in random due order is moved."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from _harness import Bench, SlowLog, evalsha_of, fill, log, median, payload, percentile, ratio
from redis.asyncio import Redis
from reference import ReferenceQueue, consuming

from aiodelayq import DelayedQueue


async def run(bench: Bench) -> dict[str, Any]:
    """For each backlog N: N items pending in random due order, all due when the transfer starts.

    Ours (:func:`transfer_ours`): filled with ``offer_many``, due times uniform over a 1 s window just
    after the expected end of the fill; once the window has passed, timed from ``open()`` of a queue on
    another client (its first transfer runs at open, then back to back) until ``ZCARD`` of the zset is 0.
    Reference: filled with pipelines of 1000 Redisson offer scripts, due times uniform over the minute
    before the fill (the list is in insertion order, the zset in due order: the element due next sits
    anywhere in the list); timed from starting its transfer task until ``ZCARD`` is 0, or for at most
    ``ref_bound_s`` seconds (then ``bounded``: the rate is moved / elapsed over that window). Worst
    single script time: ``SLOWLOG`` over the timed window."""
    s = bench.sizes
    out: dict[str, Any] = {"ns": list(s.transfer_ns), "ours": {}, "reference": {}, "ratio": {},
                           "ref_bound_s": s.ref_bound_s}
    for n in s.transfer_ns:
        runs: dict[str, list[dict[str, Any]]] = {"ours": [], "reference": []}
        rounds = s.rounds if n <= s.transfer_rounds_upto else 1
        for rnd in range(rounds):
            log(f"    N={n:,} round {rnd + 1}/{rounds}")
            runs["ours"].append(await transfer_ours(bench, n, slowlog=bench.slowlog))
            if rnd == 0 or not runs["reference"][-1]["bounded"]:
                runs["reference"].append(await _transfer_reference(bench, n))
        for impl, done in runs.items():  # the median rate; the worst script over all rounds
            worst = [r["worst_script_ms"] for r in done if r["worst_script_ms"] is not None]
            out[impl][str(n)] = {"items_per_s": median([r["items_per_s"] for r in done if r["items_per_s"]]),
                                 "worst_script_ms": max(worst, default=None),
                                 "bounded": any(r["bounded"] for r in done), "rounds": done}
        out["ratio"][str(n)] = ratio(out["ours"][str(n)]["items_per_s"], out["reference"][str(n)]["items_per_s"])
    return out


async def transfer_ours(bench: Bench, n: int, *, url: str | None = None, ctl: Redis | None = None,
                        slowlog: SlowLog | None = None, keyed: bool = False, in_order: bool = False) -> dict[str, Any]:
    """One backlog of ours on the server at ``url`` (default: the run's; ``ctl`` a client of it); script
    times from ``slowlog`` when given; ``keyed``: a unique key per item; ``in_order``: every item due 0.5 s
    after its ``offer_many`` call (due order = insertion order) instead of in random order."""
    ctl = ctl or bench.ctl
    async with bench.fresh_queue("transfer", "keyed" if keyed else "ours", clients=2, url=url, ctl=ctl) as (
            producer, consumer, name):
        keys = DelayedQueue(ctl, name).keys
        fill_rate = (bench.results.get("offer_many") or {}).get("ours", {}).get("items_per_s") or 100_000.0
        lo = bench.server_now_ms() + (1.5 * n / fill_rate + 0.3) * 1000.0
        t_fill = time.perf_counter()
        dues = await fill(DelayedQueue(producer, name), n, 0.5 if in_order else (
            lambda _: max(0.0, (lo + bench.rng.random() * 1000.0 - bench.server_now_ms()) / 1000.0)),
            batch=10_000, keyed=keyed)
        fill_s = time.perf_counter() - t_fill
        wait_s = max(0.0, ((max(dues) if in_order else max(*dues, lo + 1000.0)) + 20.0 - bench.server_now_ms()) / 1000)
        await asyncio.sleep(wait_s)
        if (pending := await ctl.zcard(keys.timeout_set)) != n:
            raise RuntimeError(f"ours fill: zset {pending}, expected {n}")
        cq: DelayedQueue[Any] = DelayedQueue(consumer, name)
        if slowlog:
            await slowlog.begin()
        t0 = time.perf_counter()
        async with cq:
            elapsed, left = await wait_empty(ctl, keys.timeout_set, t0, t0 + 600.0, "ours")
            calls = cq.stats.transfers
        times = await slowlog.end(evalsha_of(keys.dead_letter)) if slowlog else None
        if left or (keyed and await ctl.hlen(keys.key_index)):
            raise RuntimeError(f"transfer: {left} items still pending, or key index entries left behind")
    return {"items_per_s": n / elapsed, "elapsed_s": elapsed, "bounded": False, "script_calls": calls,
            "fill_s": fill_s, "waited_for_due_s": wait_s, **_scripts(times)}


async def _transfer_reference(bench: Bench, n: int) -> dict[str, Any]:
    async with bench.fresh_queue("transfer", "reference", clients=2) as (producer, consumer, name):
        ref_p = await ReferenceQueue(producer, name).prepare()
        start = time.time() * 1000.0
        t_fill = time.perf_counter()
        for b in range(0, n, 1000):
            await ref_p.offer_many(((payload(i), start - 1000.0 - bench.rng.random() * 60_000.0)
                                    for i in range(b, min(n, b + 1000))), absolute=True)
        fill_s = time.perf_counter() - t_fill
        listed = (await bench.ctl.zcard(ref_p.timeout_set), await bench.ctl.llen(ref_p.delay_list))
        if listed != (n, n):
            raise RuntimeError(f"reference fill: zset and list {listed}, expected {n}")
        sha = ref_p.shas.transfer.encode()
        await bench.slowlog.begin()
        t0 = time.perf_counter()
        async with consuming(consumer, name, ref_p.shas) as ref_c:
            # The ZCARD that ends the window is served after the script in flight, so it counts that call.
            elapsed, left = await wait_empty(bench.ctl, ref_p.timeout_set, t0, t0 + bench.sizes.ref_bound_s,
                                             "reference")
        times = await bench.slowlog.end(lambda a: a[0] == b"EVALSHA" and len(a) > 1 and a[1] == sha)
    return {"items_per_s": (n - left) / elapsed if n > left else None, "elapsed_s": elapsed, "moved": n - left,
            "bounded": left > 0, "script_calls": ref_c.transfers, "fill_s": fill_s, **_scripts(times)}


def _scripts(times: list[float] | None) -> dict[str, float | None]:
    """The worst and the median server time of the script calls ``SLOWLOG`` measured (ms)."""
    return {"worst_script_ms": max(times) if times else None,
            "p50_script_ms": percentile(sorted(times), 50) if times else None}


async def wait_empty(ctl: Redis, key: str, t0: float, deadline: float, label: str) -> tuple[float, int]:
    """Poll ``ZCARD key`` every 2 ms until 0 or ``deadline``: (seconds since ``t0``, the last ``ZCARD``)."""
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
