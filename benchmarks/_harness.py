"""What the scenarios share: sizes, the payload, logging, the server, ``SLOWLOG``, the consumer processes,
the producer of a steady due rate, CPU/RSS/counter helpers and :class:`Bench`, the context every scenario
function (``scenarios/``) takes and the driver that runs them."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import platform
import random
import resource
import secrets
import statistics
import subprocess
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import redis
from lateness import measure_clock_offset_ms, redact, server_identity
from redis.asyncio import Redis
from reference import ReferenceQueue, ReferenceSubscriber

from aiodelayq import DelayedQueue
from aiodelayq.testing import ThrowawayServer, pick_server_kind, server_version
from aiodelayq.testing.containers import loopback_redis_container

HERE = Path(__file__).resolve().parent

FAR_S = 3600.0  # delay of items that must not fall due during a scenario


@dataclass(frozen=True)
class Sizes:
    """How big and how long each scenario is (:data:`FULL`, ``--quick``: :data:`QUICK`)."""

    rounds: int = 3  # of the cheap scenarios
    # offer
    offer_callers: int = 64
    offer_seconds: float = 2.0
    # offer_many
    offer_many_items: int = 100_000
    offer_many_batch: int = 1000
    # transfer
    transfer_ns: tuple[int, ...] = (10_000, 100_000, 1_000_000)
    transfer_rounds_upto: int = 100_000  # N up to this size run --rounds times, larger ones once
    ref_bound_s: float = 15.0
    # lateness
    lateness_rate: float = 10_000.0
    lateness_seconds: float = 10.0
    # reliable_lateness
    reliable_rate: float = 2000.0
    reliable_seconds: float = 10.0
    reliable_consumers: int = 3
    reliable_vt_s: float = 30.0
    # big_item_stall
    big_item_mbs: tuple[int, ...] = (1, 10, 50)
    # e2e
    e2e_seconds: float = 5.0
    e2e_backlog: int = 20_000
    # idle
    idle_queues: int = 2000
    idle_takers: int = 100  # of the idle queues, consumed by a waiting take() (ours)
    idle_seconds: float = 20.0
    # memory
    memory_items: int = 100_000
    # lateness_async_for
    async_for_rate: float = 20_000.0
    # drain
    drain_items: int = 100_000
    drain_messages: int = 100_000
    # due_times
    due_calls: int = 60
    # keys
    keys_transfer_n: int = 100_000
    keys_rounds: int = 7  # of keyed/unkeyed offer and transfer, after a warm-up pair
    keys_pending_n: int = 1_000_000


FULL = Sizes()
QUICK = Sizes(rounds=1, offer_seconds=1.0, offer_many_items=20_000, transfer_ns=(10_000, 100_000), ref_bound_s=4.0,
              lateness_seconds=3.0, reliable_seconds=3.0, e2e_seconds=2.0, idle_seconds=6.0, memory_items=20_000,
              drain_items=20_000, drain_messages=20_000, due_calls=15, keys_transfer_n=20_000,
              keys_rounds=1, keys_pending_n=100_000)


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


# -- server -----------------------------------------------------------------------------------------


@dataclass
class Server:
    url: str
    label: str
    owned: bool  # started by this run: we may reconfigure it (SLOWLOG)
    restart: Callable[[], None] | None = None  # a fresh process on the same port (throwaway servers)
    pid: Callable[[], int] | None = None  # the server process (throwaway servers): for CPU placement


def _loopback_redis_container(image: str) -> Any:
    """``aiodelayq.testing.containers.loopback_redis_container``, or a clear exit without testcontainers."""
    try:
        return loopback_redis_container(image)
    except ImportError:
        raise SystemExit("--docker needs testcontainers: pip install 'testcontainers[redis]'") from None


@contextlib.contextmanager
def open_server(args: argparse.Namespace) -> Iterator[Server]:
    if args.redis_url:
        yield Server(args.redis_url, "url", False)
        return
    if args.docker:
        with _loopback_redis_container(args.docker_image) as container:
            port = container.get_exposed_port(container.port)
            yield Server(f"redis://127.0.0.1:{port}/0", f"docker {args.docker_image}", True)
        return
    kind = pick_server_kind(args.server_kind)
    if kind is None:
        raise SystemExit("no server kind found (pip install 'aiodelayq[server]', or --redis-url / --docker)")
    with ThrowawayServer(kind) as srv:

        def restart() -> None:
            srv.kill()
            srv.start()

        yield Server(srv.url, f"{kind.name} (v{server_version(kind.binary)})", True, restart, lambda: srv.pid)


# -- CPU placement ------------------------------------------------------------------------------------


def _pin(pid: int, cpus: set[int]) -> None:
    """Every thread of process ``pid`` (``sched_setaffinity`` of a pid moves one thread only)."""
    try:
        tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        tids = [pid]
    for tid in tids:
        with contextlib.suppress(ProcessLookupError):  # a thread that ended meanwhile
            os.sched_setaffinity(tid, cpus)


@contextlib.contextmanager
def cpu_placement(server: Server, consumer_pids: list[int]) -> Iterator[dict[str, Any]]:
    """Pin this process (the producer) to CPU 0 and ``consumer_pids`` with the server to the other CPUs
    for the block; yields what was done (``{"pinned": False, "why": ...}`` when it cannot be).

    Why: a lateness scenario's producer sends a 1,000-item ``offer_many`` every 50 ms, a few ms of CPU in
    one burst. On a 2-CPU machine the kernel wakes it on whichever CPU is free at that instant, often
    the consumer's or the server's, and the other two then wait for a timeslice: measured here, the
    items later than 4 ms were due in the 4 ms before a producer send started (not during the server's
    script), a busy loop on the other CPU cost nothing (p99 2.3 ms vs 2.3 idle), and with this placement
    async-for p99 went from 5.0-5.5 ms to 2.5-2.7 ms in the same run. The scenario then measures the
    consumer and the server, not where the kernel put the benchmark's own producer; the unpinned
    figure is kept next to it (``lateness_async_for``'s ``unpinned``)."""
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if len(cpus) < 2:
        yield {"pinned": False, "why": f"{len(cpus) or 'unknown'} CPU(s) available: nothing to place"}
        return
    if server.pid is None:
        yield {"pinned": False, "why": "the server is not a process of this run"}
        return
    producer, others = {cpus[0]}, set(cpus[1:])
    server_pid = server.pid()
    try:
        _pin(server_pid, others)
        for pid in consumer_pids:
            _pin(pid, others)
        os.sched_setaffinity(0, producer)
        yield {"pinned": True, "producer_cpus": sorted(producer), "consumer_and_server_cpus": sorted(others)}
    finally:
        os.sched_setaffinity(0, set(cpus))
        with contextlib.suppress(OSError):
            _pin(server_pid, set(cpus))


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
                self.saved[name] = as_text(got[next(iter(got))])
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

    async def count_over(self, micros: int, work: Callable[[], Awaitable[None]]) -> dict[str, Any]:
        """Run ``work`` with only commands over ``micros`` µs logged; their count and the worst (ms),
        and ``INFO commandstats`` of the window (reset at its start). Counts are ``None`` when
        ``SLOWLOG``/``CONFIG`` cannot be used."""
        if not self.enabled:
            await work()
            return {"count": None, "max_ms": None, "commandstats": {}}
        await self.ctl.config_set("slowlog-max-len", "100000")
        await self.ctl.config_set("slowlog-log-slower-than", str(micros))
        await self.ctl.slowlog_reset()
        await self.ctl.config_resetstat()
        try:
            await work()
        finally:
            await self.ctl.config_set("slowlog-log-slower-than", self.saved["slowlog-log-slower-than"])
        entries = [e for e in await self.ctl.slowlog_get(100_000)
                   if bytes(e["command"]).upper().startswith(b"EVALSHA")]
        await self.ctl.slowlog_reset()
        durations = [e["duration"] / 1000.0 for e in entries]
        return {"count": len(durations), "max_ms": max(durations) if durations else 0.0,
                "commandstats": await self.ctl.info("commandstats")}

    async def restore(self) -> None:
        for name, value in self.saved.items():
            with contextlib.suppress(Exception):
                await self.ctl.config_set(name, value)


def as_text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


# -- consumer processes (multiprocessing "spawn" targets: importable from here in the child) ----------


async def join_or_terminate(proc: Any) -> None:
    """Wait up to 15 s for a consumer process, then terminate it (bounded)."""
    await asyncio.to_thread(proc.join, 15.0)
    if proc.is_alive():
        proc.terminate()
        await asyncio.to_thread(proc.join, 5.0)


def lateness_consumer_main(conn: Any, url: str, name: str, impl: str, total: int, bound_s: float) -> None:
    """Child process: open the queue (ours) or start the reference scheduler, then take until ``total``
    items arrived or ``bound_s`` passed; send back ``(ids, receipt times in local epoch ms)`` and the
    process's CPU seconds (``cpu_s``: how close the consumer came to saturating its core)."""
    try:
        profile = os.environ.get("AIODELAYQ_PROFILE_CONSUMER")
        if profile:  # a developer's tool: cProfile of the consumer, written to that path
            import cProfile

            with cProfile.Profile() as prof:
                result = asyncio.run(_lateness_consume(conn, url, name, impl, total, bound_s))
            prof.dump_stats(profile)
        else:
            result = asyncio.run(_lateness_consume(conn, url, name, impl, total, bound_s))
        usage = resource.getrusage(resource.RUSAGE_SELF)
        result["cpu_s"] = usage.ru_utime + usage.ru_stime
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
        if impl == "ours_async_for":
            queue: DelayedQueue[dict[str, Any]] = DelayedQueue(client, name)
            async with queue:
                conn.send("ready")

                async def consume() -> None:
                    async for item in queue:  # one item per iteration: the way most users consume
                        ids.append(item["order"])
                        times.append(time.time() * 1000.0)
                        if len(ids) >= total:
                            return

                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(consume(), bound_s)
                extra = asdict(queue.stats)
        elif impl == "ours":
            queue = DelayedQueue(client, name)
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


async def stop_reference(ref: ReferenceQueue | None, sub: ReferenceSubscriber | None) -> None:
    """Stop a reference scheduler and close its subscriber, those of the two that were started."""
    if ref is not None:
        await ref.stop()
    if sub is not None:
        await sub.aclose()


# -- measuring helpers ---------------------------------------------------------------------------------


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
    sends: list[tuple[float, float, int]] = []
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
            sent_at = time.time() * 1000.0
            dues = await send(batch)
            sends.append((sent_at, time.time() * 1000.0, len(batch)))
            for (item, _), d in zip(batch, dues, strict=True):
                due[item["order"]] = float(d)
            if len(batch) == 1000:
                continue
        if loop.time() >= next_print:
            log(f"      {label}: offered {next_id:,}/{total:,}")
            next_print += 2.0
        tick += tick_s
        await asyncio.sleep(max(0.0, tick - loop.time()))
    dump = os.environ.get("AIODELAYQ_DUMP_SENDS")
    if dump:  # a developer's tool: (start, end local epoch ms, size) of every send, for tail analysis
        await asyncio.to_thread(Path(dump).write_text, json.dumps(sends))
    return clamped


def log_histogram(values: list[float]) -> dict[str, Any]:
    """Counts per log-spaced bin from 0.01 ms to 100 s (values below go in the first bin)."""
    edges = [10 ** (e / 10) for e in range(-20, 51)]  # 0.01 ms .. 100,000 ms, 10 bins per decade
    counts = [0] * (len(edges) - 1)
    for v in values:
        v = min(max(v, edges[0]), edges[-1] * 0.999)
        idx = min(len(counts) - 1, max(0, math.floor((math.log10(v) + 2) * 10)))
        counts[idx] += 1
    return {"edges_ms": edges, "counts": counts, "below_first_edge": sum(1 for v in values if v < edges[0])}


def cpu_times() -> tuple[int, int] | None:
    """(busy, total) jiffies of all CPUs from ``/proc/stat`` (Linux); ``None`` elsewhere."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return sum(fields) - idle, sum(fields)


def busy_share(before: tuple[int, int] | None, after: tuple[int, int] | None) -> float | None:
    """Percent of all CPUs busy between two :func:`cpu_times` samples."""
    if before is None or after is None or after[1] <= before[1]:
        return None
    return 100.0 * (after[0] - before[0]) / (after[1] - before[1])


async def server_counters(ctl: Redis) -> dict[str, Any]:
    """The server's CPU seconds (``INFO cpu``), commands processed and calls per command."""
    cpu = await ctl.info("cpu")
    stats = await ctl.info("stats")
    cs = await ctl.info("commandstats")
    return {"cpu_s": float(cpu.get("used_cpu_sys", 0)) + float(cpu.get("used_cpu_user", 0)),
            "commands": int(stats["total_commands_processed"]),
            "calls": {k.removeprefix("cmdstat_"): int(v.get("calls", 0)) for k, v in cs.items()}}


# -- the context the scenarios share ----------------------------------------------------------------


class Bench:
    """One run: its options, sizes, server, control client (``ctl``), ``SLOWLOG``, clock offset, seeded
    random numbers and the results so far; unique key names, clients and cleanup for the scenarios."""

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

    @contextlib.asynccontextmanager
    async def fresh_queue(self, scenario: str, impl: str) -> AsyncIterator[tuple[Redis, str]]:
        """A client of its own and a new queue name; on the way out the client is closed and the queue's
        keys are deleted."""
        client = self.client()
        name = self.name(scenario, impl)
        try:
            yield client, name
        finally:
            await client.aclose()
            await self.drop(name)

    async def drop(self, *names: str, client: Redis | None = None) -> None:
        """Delete every key of the given queues (ours and the reference use the same key names), on
        the run's server or on the one ``client`` talks to."""
        client = client or self.ctl
        keys: list[str] = []
        for n in names:
            keys += DelayedQueue(client, n).keys.all
        for i in range(0, len(keys), 1000):
            await client.unlink(*keys[i:i + 1000])

    async def sweep(self) -> int:
        """Delete any key left by this run (every key name carries the run's token)."""
        found = 0
        async for key in self.ctl.scan_iter(match=f"*aiodelayq-bench:{self.token}:*", count=1000):
            await self.ctl.unlink(key)
            found += 1
        return found

    async def fresh_server(self) -> None:
        """A new server process on the same port before a scenario: a scenario must not pay for the
        heap an earlier one left behind (after the 1M-item transfer, `async for` lateness p99 was
        0.5-1 ms worse than on a fresh server in four A/B pairs; its max doubled)."""
        assert self.server.restart is not None
        await self.ctl.connection_pool.disconnect()
        await asyncio.to_thread(self.server.restart)
        await self.ctl.ping()

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

    # driver -----------------------------------------------------------------------------------------

    async def run(self, scenarios: Mapping[str, Scenario]) -> dict[str, Any]:
        """Run ``scenarios`` (name -> scenario function) in their order; the whole result as written to
        ``results.json`` (without the bars)."""
        t_start = time.perf_counter()
        await self.slowlog.setup()
        machine = await self.machine()
        self.offset_ms, offset_rtt = await measure_clock_offset_ms(self.ctl)
        log(f"server: {machine['server']['kind']} {machine['server']['server_name']} "
            f"{machine['server']['server_version']} ({machine['server']['mem_allocator']}) at {redact(self.url)}; "
            f"clock offset {self.offset_ms:+.3f} ms "
            f"(TIME rtt {offset_rtt:.3f} ms); run token {self.token}")
        log(f"machine: {machine['nproc']} CPUs ({machine['cpu']}), Python {machine['python']}, "
            f"redis-py {machine['redis_py']}, hiredis {machine['hiredis']}; SLOWLOG "
            f"{'on' if self.slowlog.enabled else 'off'}")
        try:
            for n, (scenario, measure) in enumerate(scenarios.items()):
                log(f"== {scenario}")
                if n and self.server.restart is not None and not self.args.same_server:
                    await self.fresh_server()
                t0 = time.perf_counter()
                self.results[scenario] = await measure(self)
                self.results[scenario]["scenario_s"] = time.perf_counter() - t0
                log(f"   ({time.perf_counter() - t0:.1f} s)")
        finally:
            await self.slowlog.restore()
            left = await self.sweep()
            if left:
                log(f"deleted {left} leftover key(s) of this run")
            await self.ctl.aclose()
        return {"machine": machine, "config": {**asdict(self.sizes), "quick": self.args.quick, "seed": self.args.seed,
                                               "clock_offset_ms": self.offset_ms, "slowlog": self.slowlog.enabled,
                                               "fresh_server_per_scenario": self.server.restart is not None
                                               and not self.args.same_server},
                "scenarios": self.results, "total_s": time.perf_counter() - t_start}


Scenario = Callable[[Bench], Awaitable[dict[str, Any]]]
"""A scenario (one module of ``scenarios/``): takes the shared context, returns its result dict."""


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
