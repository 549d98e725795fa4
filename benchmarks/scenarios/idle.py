"""Scenario ``idle``: many open queues with nothing pending: commands, connections, client memory."""

from __future__ import annotations

import asyncio
import logging
import statistics
import time
from typing import Any

from _harness import Bench, as_text, log, rss_bytes
from redis.asyncio import BlockingConnectionPool, Redis
from reference import ReferenceQueue, ReferenceSubscriber, ScriptShas
from report import fmt_mb

from aiodelayq import DelayedQueue


async def run(bench: Bench) -> dict[str, Any]:
    """``idle_queues`` queues opened on one client in this process (redis-py's default pool), nothing
    pending, ``idle_takers`` of ours waiting in ``take()``, for ``idle_seconds``: commands the server
    processed per second (``INFO stats`` ``total_commands_processed`` delta, which counts the commands
    a script runs as well as the ``EVALSHA`` itself; the same measuring sequence with no queue open is
    subtracted), script calls/s (``INFO commandstats`` ``cmdstat_evalsha``), pub/sub connections
    (``CLIENT LIST TYPE pubsub`` minus those before opening), this process's RSS sampled every 0.5 s;
    then the time to close every queue at once (``asyncio.gather`` of their ``aclose()``), and the
    library's log lines at WARNING or above while open and closing."""
    s = bench.sizes
    out: dict[str, Any] = {"queues": s.idle_queues, "seconds": s.idle_seconds}
    baseline = await _idle_measure(bench, 1.0)
    out["baseline_commands"] = baseline["commands"]
    for impl in ("ours", "reference"):
        out[impl] = await _idle(bench, impl, baseline["commands"])
    return out


async def _idle_measure(bench: Bench, seconds: float, sample_rss: bool = False) -> dict[str, Any]:
    before = await bench.ctl.info("stats")
    before_cs = await bench.ctl.info("commandstats")
    t0 = time.perf_counter()
    rss: list[tuple[float, int]] = []
    pubsub = None
    while time.perf_counter() - t0 < seconds:
        r = rss_bytes()
        if sample_rss and r is not None:
            rss.append((time.perf_counter() - t0, r))
        if pubsub is None and time.perf_counter() - t0 >= seconds / 2:
            pubsub = await _pubsub_count(bench)
        await asyncio.sleep(min(0.5, max(0.0, seconds - (time.perf_counter() - t0))))
    if pubsub is None:
        pubsub = await _pubsub_count(bench)
    after_cs = await bench.ctl.info("commandstats")
    after = await bench.ctl.info("stats")
    elapsed = time.perf_counter() - t0
    evalsha = (_calls(after_cs, "evalsha") - _calls(before_cs, "evalsha"))
    return {"commands": after["total_commands_processed"] - before["total_commands_processed"],
            "evalsha": evalsha, "elapsed": elapsed, "pubsub": pubsub, "rss": rss}


async def _pubsub_count(bench: Bench, kind: str = "pubsub") -> int:
    """Connections of ``kind`` (``pubsub``, ``normal``) that the server lists."""
    listing = await bench.ctl.execute_command("CLIENT", "LIST", "TYPE", kind)
    text = as_text(listing) if not isinstance(listing, list) else "\n".join(map(as_text, listing))
    return sum(1 for line in text.splitlines() if line.strip())


async def _idle(bench: Bench, impl: str, own_commands: int) -> dict[str, Any]:
    s = bench.sizes
    if impl == "ours":
        client = bench.client()
    else:  # Redisson's default pool: at most 64 connections (else 1000 first transfers open 1000 sockets)
        client = Redis(connection_pool=BlockingConnectionPool.from_url(bench.url, max_connections=64))
    names = [bench.name("idle", impl) for _ in range(s.idle_queues)]
    pubsub_before = await _pubsub_count(bench)
    normal_before = await _pubsub_count(bench, "normal")
    sub = None
    refs: list[ReferenceQueue] = []
    queues: list[DelayedQueue[Any]] = []
    takers: list[asyncio.Task[Any]] = []
    warnings = _CountingHandler()
    lib_log = logging.getLogger("aiodelayq")
    lib_log.addHandler(warnings)
    lib_log.propagate = False  # counted and summarised, not printed one by one
    try:
        t0 = time.perf_counter()
        if impl == "ours":
            queues = [DelayedQueue(client, n) for n in names]
            await asyncio.gather(*(q.open() for q in queues))
            takers = [asyncio.create_task(q.take()) for q in queues[:s.idle_takers]]
        else:
            shas = await ScriptShas().load(client)
            sub = ReferenceSubscriber(client)
            for n in names:
                ref = await ReferenceQueue(client, n).prepare(shas)
                ref.start(sub)
                refs.append(ref)
            await sub.start()
            # Each queue's first transfer runs on its subscribe confirmation: wait for all of them.
            for _ in range(6000):  # at most 60 s
                if all(r.stats.transfers for r in refs):
                    break
                await asyncio.sleep(0.01)
        open_s = time.perf_counter() - t0
        # Ours: past the first safety poll (5 s after open), so the window shows the steady state.
        await asyncio.sleep(6.0 if impl == "ours" else 1.0)
        log(f"    {impl:9}: {s.idle_queues} queues open in {open_s:.2f} s; measuring {s.idle_seconds:g} s")
        errors_before = sum(q.stats.transfer_errors for q in queues) + sum(r.stats.errors for r in refs)
        m = await _idle_measure(bench, s.idle_seconds, sample_rss=True)
        normal = await _pubsub_count(bench, "normal") - normal_before
        errors = sum(q.stats.transfer_errors for q in queues) + sum(r.stats.errors for r in refs) - errors_before
    finally:
        t_close = time.perf_counter()
        await asyncio.gather(*(q.aclose() for q in queues), return_exceptions=True)
        await asyncio.gather(*takers, return_exceptions=True)  # each ends with QueueClosedError
        for ref in refs:
            await ref.stop()
        if sub is not None:
            await sub.aclose()
        close_s = time.perf_counter() - t_close
        lib_log.removeHandler(warnings)
        lib_log.propagate = True
        await client.aclose()
        await bench.drop(*names)
    rss = m["rss"]
    rss_first = rss[0][1] if rss else None
    rss_last = rss[-1][1] if rss else None
    slope = _slope(rss) if len(rss) >= 3 else None
    half = [r for t, r in rss if t >= m["elapsed"] / 2]
    commands = max(0, m["commands"] - own_commands)
    result = {"open_s": open_s, "close_s": close_s, "elapsed_s": m["elapsed"], "takers": len(takers),
              "commands_per_s": commands / m["elapsed"], "script_calls_per_s": m["evalsha"] / m["elapsed"],
              # Ours: the client's safety poll reads three keys per queue per safety_poll_s (5 s),
              # a queue looked at up to a fifth early; no script call.
              "expected_commands_per_s": 3 * s.idle_queues / 5.0 / 0.8 if impl == "ours" else 0.0,
              "pubsub_connections": m["pubsub"] - pubsub_before, "other_connections": normal,
              "transfer_errors": errors, "log_warnings": warnings.count,
              "rss_first_mb": rss_first / 2**20 if rss_first else None,
              "rss_last_mb": rss_last / 2**20 if rss_last else None,
              "rss_max_mb": max(r for _, r in rss) / 2**20 if rss else None,
              "rss_growth_mb": (rss_last - rss_first) / 2**20 if rss_first and rss_last else None,
              "rss_slope_mb_per_min": slope * 60 / 2**20 if slope is not None else None,
              "rss_growth_second_half_mb": (half[-1] - half[0]) / 2**20 if len(half) >= 2 else None,
              "rss_samples": [(round(t, 2), r) for t, r in rss]}
    if errors or warnings.count:
        log(f"    {impl:9}: {errors} failed transfer calls during the window, {warnings.count} library warnings "
            f"while open and closing (first: {warnings.first})")
    log(f"    {impl:9}: {result['commands_per_s']:,.0f} commands/s ({result['script_calls_per_s']:,.0f} script "
        f"calls/s), {result['pubsub_connections']} pub/sub + {normal} other connection(s), "
        f"RSS {fmt_mb(result['rss_first_mb'])} -> {fmt_mb(result['rss_last_mb'])} "
        f"(growth {fmt_mb(result['rss_growth_mb'])}); all closed at once in {close_s:.2f} s")
    return result


class _CountingHandler(logging.Handler):
    """Counts the library's log records (and keeps the first) instead of printing each."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.count = 0
        self.first: str | None = None

    def emit(self, record: logging.LogRecord) -> None:
        self.count += 1
        if self.first is None:
            self.first = record.getMessage()


def _calls(commandstats: dict[str, Any], command: str) -> int:
    entry = commandstats.get(f"cmdstat_{command}") or {}
    return int(entry.get("calls", 0))


def _slope(points: list[tuple[float, int]]) -> float:
    """Least-squares slope (units per second)."""
    xs = [p[0] for p in points]
    ys = [float(p[1]) for p in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    den = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / den if den else 0.0
