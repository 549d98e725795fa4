"""Scenario ``idle``: many open queues with nothing pending: commands, connections, client memory."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from typing import Any

from _harness import Bench, as_text
from redis.asyncio import BlockingConnectionPool, Redis
from reference import ReferenceQueue, ReferenceSubscriber, ScriptShas

from aiodelayq import DelayedQueue


async def run(bench: Bench) -> dict[str, Any]:
    """``idle_queues`` queues opened on one client in this process, nothing pending, ``idle_takers`` of
    ours waiting in ``take()``, for ``idle_seconds``: commands the server processed per second (``INFO
    stats`` ``total_commands_processed``, which counts the commands a script runs as well as the
    ``EVALSHA``; the same measuring sequence with no queue open is subtracted), script calls/s (``INFO
    commandstats``), pub/sub and other connections (``CLIENT LIST``, minus those before opening), this
    process's RSS sampled every 0.5 s; then the time to close every queue at once (``asyncio.gather`` of
    their ``aclose()``), and the library's log lines at WARNING or above while open and closing. The
    reference's client has a blocking pool of 64 connections (Redisson's default pool size)."""
    s = bench.sizes
    baseline = (await _measure(bench, 1.0))["commands"]
    out: dict[str, Any] = {"queues": s.idle_queues, "seconds": s.idle_seconds, "baseline_commands": baseline}
    for impl in ("ours", "reference"):
        out[impl] = await _idle(bench, impl, baseline)
    return out


async def _measure(bench: Bench, seconds: float) -> dict[str, Any]:
    before, before_cs = await bench.ctl.info("stats"), await bench.ctl.info("commandstats")
    t0 = time.perf_counter()
    rss: list[int] = []
    pubsub = None
    while (elapsed := time.perf_counter() - t0) < seconds:
        if (r := _rss_bytes()) is not None:
            rss.append(r)
        if pubsub is None and elapsed >= seconds / 2:
            pubsub = await _connections(bench, "pubsub")
        await asyncio.sleep(min(0.5, seconds - elapsed))
    after_cs, after = await bench.ctl.info("commandstats"), await bench.ctl.info("stats")
    evalsha = [int((cs.get("cmdstat_evalsha") or {}).get("calls", 0)) for cs in (before_cs, after_cs)]
    return {"commands": after["total_commands_processed"] - before["total_commands_processed"],
            "evalsha": evalsha[1] - evalsha[0], "elapsed": time.perf_counter() - t0,
            "pubsub": pubsub if pubsub is not None else await _connections(bench, "pubsub"), "rss": rss}


async def _connections(bench: Bench, kind: str) -> int:
    """Connections of ``kind`` (``pubsub``, ``normal``) that the server lists."""
    listing = await bench.ctl.execute_command("CLIENT", "LIST", "TYPE", kind)
    text = "\n".join(map(as_text, listing)) if isinstance(listing, list) else as_text(listing)
    return sum(1 for line in text.splitlines() if line.strip())


async def _idle(bench: Bench, impl: str, own_commands: int) -> dict[str, Any]:
    s = bench.sizes
    # The reference's pool is blocking: else the first transfers of 1000 queues open 1000 sockets.
    client = bench.client() if impl == "ours" else Redis(
        connection_pool=BlockingConnectionPool.from_url(bench.url, max_connections=64))
    names = [bench.name("idle", impl) for _ in range(s.idle_queues)]
    before = {kind: await _connections(bench, kind) for kind in ("pubsub", "normal")}
    refs: list[ReferenceQueue] = []
    queues: list[DelayedQueue[Any]] = []
    takers: list[asyncio.Task[Any]] = []
    warnings = _CountingHandler(logging.WARNING)
    lib_log = logging.getLogger("aiodelayq")
    lib_log.addHandler(warnings)
    lib_log.propagate = False  # counted and summarised, not printed one by one
    sub = ReferenceSubscriber(client)
    try:
        t0 = time.perf_counter()
        if impl == "ours":
            queues = [DelayedQueue(client, n) for n in names]
            await asyncio.gather(*(q.open() for q in queues))
            takers = [asyncio.create_task(q.take()) for q in queues[:s.idle_takers]]
        else:
            shas = await ScriptShas().load(client)
            for n in names:
                refs.append(await ReferenceQueue(client, n).prepare(shas))
                refs[-1].start(sub)
            await sub.start()
            for _ in range(6000):  # each queue's first transfer runs on its subscribe confirmation; <= 60 s
                if all(r.transfers for r in refs):
                    break
                await asyncio.sleep(0.01)
        open_s = time.perf_counter() - t0
        await asyncio.sleep(6.0 if impl == "ours" else 1.0)  # ours: past the first safety poll (5 s after open)

        def errors() -> int:
            return sum(q.stats.transfer_errors for q in queues) + sum(r.errors for r in refs)

        errors_before = errors()
        m = await _measure(bench, s.idle_seconds)
        normal = await _connections(bench, "normal") - before["normal"]
        errors_during = errors() - errors_before
    finally:
        t_close = time.perf_counter()
        await asyncio.gather(*(q.aclose() for q in queues), return_exceptions=True)
        await asyncio.gather(*takers, return_exceptions=True)  # each ends with QueueClosedError
        for ref in refs:
            await ref.stop()
        await sub.aclose()
        close_s = time.perf_counter() - t_close
        lib_log.removeHandler(warnings)
        lib_log.propagate = True
        await client.aclose()
        await bench.drop(*names)
    rss = m["rss"]
    return {"open_s": open_s, "close_s": close_s, "elapsed_s": m["elapsed"], "takers": len(takers),
            "commands_per_s": max(0, m["commands"] - own_commands) / m["elapsed"],
            "script_calls_per_s": m["evalsha"] / m["elapsed"],
            # Ours: the client's safety poll reads three keys per queue per safety_poll_s (5 s), a queue
            # looked at up to a fifth early; no script call.
            "expected_commands_per_s": 3 * s.idle_queues / 5.0 / 0.8 if impl == "ours" else 0.0,
            "pubsub_connections": m["pubsub"] - before["pubsub"], "other_connections": normal,
            "transfer_errors": errors_during, "log_warnings": warnings.count, "first_warning": warnings.first,
            "rss_mb": rss[-1] / 2**20 if rss else None, "rss_growth_mb": (rss[-1] - rss[0]) / 2**20 if rss else None}


def _rss_bytes() -> int | None:
    """Resident set size of this process (Linux ``/proc``), else ``None``."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


class _CountingHandler(logging.Handler):
    """Counts the library's log records (and keeps the first) instead of printing each."""

    count, first = 0, ""

    def emit(self, record: logging.LogRecord) -> None:
        self.count += 1
        self.first = self.first or record.getMessage()
