"""What the scenarios share: sizes, the payload, statistics, the server, ``SLOWLOG``, CPU placement, consumer
processes, the ways of timing (:func:`alternate`, :func:`concurrent_rate`, :func:`produce_spread`) and
:class:`Bench`, the context every scenario function (``scenarios/``) takes and the driver that runs them."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import platform
import random
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import redis
from redis.asyncio import Redis

from aiodelayq import DelayedQueue
from aiodelayq.testing import ThrowawayServer, pick_server_kind, server_version
from aiodelayq.testing.containers import loopback_redis_container

HERE = Path(__file__).resolve().parent

FAR_S = 3600.0  # delay of items that must not fall due during a scenario


@dataclass(frozen=True)
class Sizes:
    """How big and how long each scenario is (:data:`FULL`; ``--quick``: :data:`QUICK`)."""

    rounds: int = 3  # of the cheap scenarios
    offer_callers: int = 64
    offer_seconds: float = 2.0
    offer_many_items: int = 100_000
    offer_many_batch: int = 1000
    transfer_ns: tuple[int, ...] = (10_000, 100_000, 1_000_000)
    transfer_rounds_upto: int = 100_000  # N up to this size run ``rounds`` times, larger ones once
    ref_bound_s: float = 15.0
    lateness_rate: float = 10_000.0
    lateness_seconds: float = 10.0
    async_for_rate: float = 20_000.0
    reliable_rate: float = 2000.0
    reliable_seconds: float = 10.0
    reliable_consumers: int = 3
    reliable_vt_s: float = 30.0
    e2e_seconds: float = 5.0
    e2e_backlog: int = 20_000
    idle_queues: int = 2000
    idle_takers: int = 100  # of the idle queues, consumed by a waiting take() (ours)
    idle_seconds: float = 20.0
    memory_items: int = 100_000
    drain_items: int = 50_000  # per drain of the drain scenario, which times ``drain_rounds`` of each consumer
    drain_rounds: int = 10
    group_items: int = 100_000  # drained by take_many(1000) in 10 groups, then in as many groups as items
    due_calls: int = 200
    keys_transfer_n: int = 100_000
    keys_rounds: int = 7  # of keyed/unkeyed offer and transfer, after a warm-up pair
    keys_pending_n: int = 1_000_000
    startup_runs: int = 11  # of each process of the startup scenario
    otel_rounds: int = 11  # of the otel scenario's offer and drain, in each of its three processes
    otel_offer_seconds: float = 1.0
    otel_items: int = 50_000  # drained in each round
    scale_items: int = 10_000_000  # pending items of the pending_10m scenario
    scale_due: int = 1_000_000  # of them due when its consumer opens


FULL = Sizes()
QUICK = Sizes(offer_seconds=1.0, offer_many_items=20_000, transfer_ns=(10_000, 100_000), ref_bound_s=4.0,
              lateness_seconds=3.0, reliable_seconds=3.0, e2e_seconds=2.0, idle_seconds=6.0, memory_items=20_000,
              drain_items=20_000, drain_rounds=12, group_items=20_000, due_calls=60, keys_transfer_n=20_000,
              keys_rounds=3, keys_pending_n=100_000, startup_runs=5,
              otel_rounds=8, otel_offer_seconds=0.5, otel_items=20_000,
              scale_items=1_000_000, scale_due=100_000)


def payload(i: int) -> dict[str, Any]:
    """The benchmark item: ~45 bytes of compact JSON."""
    return {"order": i, "user": f"u{i % 100_000_000:08d}", "note": "x"}


def log(msg: str) -> None:
    print(msg, flush=True)


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def percentile(sorted_values: list[float], p: float) -> float | None:
    """Nearest-rank percentile of an ascending list (``None`` when empty)."""
    if not sorted_values:
        return None
    return sorted_values[min(max(1, math.ceil(p / 100.0 * len(sorted_values))), len(sorted_values)) - 1]


def summarize(values: list[float]) -> dict[str, float | None]:
    s = sorted(values)
    return {"p50": percentile(s, 50), "p90": percentile(s, 90), "p99": percentile(s, 99),
            "max": s[-1] if s else None, "mean": statistics.fmean(s) if s else None}


def log_histogram(values: list[float]) -> dict[str, Any]:
    """Counts per log-spaced bin from 0.01 ms to 100 s, 10 bins per decade (for the figure)."""
    edges = [10 ** (e / 10) for e in range(-20, 51)]
    counts = [0] * (len(edges) - 1)
    for v in values:
        v = min(max(v, edges[0]), edges[-1] * 0.999)
        counts[min(len(counts) - 1, max(0, math.floor((math.log10(v) + 2) * 10)))] += 1
    return {"edges_ms": edges, "counts": counts}


def as_text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


# -- the server -----------------------------------------------------------------------------------------


@dataclass
class Server:
    url: str
    label: str
    owned: bool  # started by this run: it may be reconfigured (SLOWLOG)
    restart: Callable[[], None] | None = None  # a fresh process on the same port (throwaway servers)
    pid: Callable[[], int] | None = None  # the server process (throwaway servers): for CPU placement


@contextlib.contextmanager
def open_server(args: argparse.Namespace) -> Iterator[Server]:
    if args.redis_url:
        yield Server(args.redis_url, "url", False)
        return
    if args.docker:
        try:
            container = loopback_redis_container(args.docker_image)
        except ImportError:
            raise SystemExit("--docker needs testcontainers: pip install 'testcontainers[redis]'") from None
        with container:
            yield Server(f"redis://127.0.0.1:{container.get_exposed_port(container.port)}/0",
                         f"docker {args.docker_image}", True)
        return
    kind = pick_server_kind(args.server_kind)
    if kind is None:
        raise SystemExit("no server kind found (pip install 'aiodelayq[server]', or --redis-url / --docker)")
    with ThrowawayServer(kind) as srv:

        def restart() -> None:
            srv.kill()
            srv.start()

        yield Server(srv.url, f"{kind.name} (v{server_version(kind.binary)})", True, restart, lambda: srv.pid)


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
    """This process (the producer) on CPU 0, ``consumer_pids`` and the server on the other CPUs, for the
    block; yields what was done. The producer's ``offer_many`` every 50 ms is a burst of CPU that the
    kernel, on a 2-CPU machine, often runs on the consumer's CPU: the scenarios measure the consumer and
    the server, not where the kernel put the producer."""
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if len(cpus) < 2 or server.pid is None:
        yield {"pinned": False, "why": "fewer than 2 CPUs, or the server is not a process of this run"}
        return
    producer, others = {cpus[0]}, set(cpus[1:])
    server_pid = server.pid()
    try:
        for pid in (server_pid, *consumer_pids):
            _pin(pid, others)
        os.sched_setaffinity(0, producer)
        yield {"pinned": True, "producer_cpus": sorted(producer), "consumer_and_server_cpus": sorted(others)}
    finally:
        os.sched_setaffinity(0, set(cpus))
        with contextlib.suppress(OSError):
            _pin(server_pid, set(cpus))


class SlowLog:
    """Server execution time of commands, from ``SLOWLOG`` (threshold lowered only inside a window)."""

    def __init__(self, ctl: Redis, enabled: bool) -> None:
        self.ctl, self.enabled = ctl, enabled
        self.saved: dict[str, str] = {}

    async def setup(self) -> None:
        try:
            for name in ("slowlog-log-slower-than", "slowlog-max-len") if self.enabled else ():
                self.saved[name] = as_text(next(iter((await self.ctl.config_get(name)).values())))
        except Exception as exc:  # e.g. CONFIG disabled on a managed server
            log(f"  SLOWLOG not usable ({exc!r}): script times are not measured")
            self.enabled = False

    async def begin(self, micros: int = 0) -> None:
        """Log every command slower than ``micros`` from now on (and reset ``INFO commandstats``)."""
        if self.enabled:
            await self.ctl.config_set("slowlog-max-len", "100000")
            await self.ctl.config_set("slowlog-log-slower-than", str(micros))
            await self.ctl.slowlog_reset()
            await self.ctl.config_resetstat()

    async def end(self, match: Callable[[list[bytes]], bool]) -> list[float] | None:
        """Durations in ms of the commands logged since :meth:`begin` for which ``match(args)``;
        ``None`` when not measured."""
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


def evalsha_of(key: str) -> Callable[[list[bytes]], bool]:
    """A :meth:`SlowLog.end` filter: the ``EVALSHA`` calls that name ``key``."""
    k = key.encode()
    return lambda args: args[0] == b"EVALSHA" and k in args


# -- processes --------------------------------------------------------------------------------------------


class Child:
    """A process of this run (``asyncio`` subprocess) talking in lines: commands on stdin, answers on stdout;
    its stderr in a temporary file (a worker logs, and a pipe nobody reads fills up). Every wait is bounded:
    a process that overstays is a failure, not a measurement."""

    def __init__(self, argv: list[str], proc: asyncio.subprocess.Process, errors: Any) -> None:
        self.argv, self.proc, self.errors = argv, proc, errors

    @classmethod
    async def start(cls, argv: list[str], *, stdin: bool = False, **kwargs: Any) -> Child:
        errors = tempfile.TemporaryFile()  # noqa: SIM115 - closed by stop()
        proc = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.PIPE if stdin else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=errors, limit=2**30, **kwargs)
        return cls(argv, proc, errors)

    @classmethod
    async def python(cls, function: str, *args: Any, **kwargs: Any) -> Child:
        """A new process of this interpreter running ``await function(*args)`` (``module.name``, a module next
        to this file) that prints its result, with the process's CPU seconds, as the last line (JSON)."""
        code = (f"import asyncio, json, os, sys; sys.path.insert(0, {str(HERE)!r}); from {function.rpartition('.')[0]} "
                f"import {function.rpartition('.')[2]} as f; r = asyncio.run(f(*json.loads(sys.argv[1]))); "
                "print(json.dumps({**r, 'cpu_s': sum(os.times()[:2])}), flush=True)")
        return await cls.start([sys.executable, "-c", code, json.dumps(args)], stdin=True, **kwargs)

    def fail(self, why: str) -> RuntimeError:
        self.errors.seek(0)
        return RuntimeError(f"{self.argv[:3]}: {why}: {self.errors.read().decode(errors='replace')[-2000:]}")

    async def send(self, command: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(command.encode() + b"\n")
        await self.proc.stdin.drain()

    async def line(self, bound_s: float, command: str | None = None) -> bytes:
        """Its next line of output (after sending ``command``, if given); a failure when it ends first."""
        assert self.proc.stdout is not None
        if command is not None:
            await self.send(command)
        try:
            line = await asyncio.wait_for(self.proc.stdout.readline(), bound_s)
        except asyncio.TimeoutError:
            raise self.fail(f"no answer within {bound_s:g} s") from None
        if not line:
            raise self.fail(f"exit {await self.proc.wait()}")
        return line

    async def wait(self, bound_s: float) -> None:
        """Until it exits, with status 0 (else a failure)."""
        try:
            await asyncio.wait_for(self.proc.wait(), bound_s)
        except asyncio.TimeoutError:
            raise self.fail(f"still running after {bound_s:g} s") from None
        if self.proc.returncode:
            raise self.fail(f"exit {self.proc.returncode}")

    async def stop(self, bound_s: float = 15.0) -> None:
        """If it still runs: its stdin closed (or SIGTERM without one), killed after ``bound_s``."""
        if self.proc.returncode is None:
            if self.proc.stdin is not None:
                self.proc.stdin.close()
            else:
                with contextlib.suppress(ProcessLookupError):
                    self.proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.proc.wait(), bound_s)
            except asyncio.TimeoutError:
                self.proc.kill()
                await self.proc.wait()
        self.errors.close()


# -- timing ---------------------------------------------------------------------------------------------


async def alternate(variants: Sequence[str], rounds: int, measure: Callable[[str], Awaitable[float]], metric: str,
                    *, flip: bool = False, label: str = "") -> dict[str, Any]:
    """``measure(variant)`` of each variant in turn, ``rounds`` times (``flip``: in reverse order every other
    round, so that none always runs on what another just freed): per variant, the median as ``metric`` and
    every round."""
    got: dict[str, list[float]] = {v: [] for v in variants}
    for rnd in range(rounds):
        for v in variants[::-1] if flip and rnd % 2 else variants:
            got[v].append(await measure(v))
            log(f"    {label}round {rnd + 1} {v:12}: {got[v][-1]:,.0f} {metric.replace('_per_s', '/s')}")
    return {v: {metric: median(r), "rounds": r} for v, r in got.items()}


async def paired(bench: Bench, measure: Callable[[str], Awaitable[float]], metric: str) -> dict[str, Any]:
    """:func:`alternate` of ``"ours"`` and ``"reference"`` over ``rounds``, with the ratio of the medians."""
    out = await alternate(("ours", "reference"), bench.sizes.rounds, measure, metric)
    out["ratio"] = ratio(out["ours"][metric], out["reference"][metric])
    return out


async def concurrent_rate(call: Callable[[int], Awaitable[Any]], callers: int, seconds: float) -> float:
    """``callers`` tasks, each awaiting ``call(i)`` in a loop (``i``: a new number each time) for
    ``seconds``: completed calls per second."""
    loop = asyncio.get_running_loop()
    stop_at = loop.time() + seconds
    done = 0

    async def caller(i: int) -> None:
        nonlocal done
        while loop.time() < stop_at:
            await call(i)
            done += 1
            i += callers

    t0 = time.perf_counter()
    await asyncio.gather(*(caller(c) for c in range(callers)))
    return done / (time.perf_counter() - t0)


async def until(read: Callable[[], Awaitable[Any]], done: Callable[[Any], bool], bound_s: float,
                every_s: float = 0.01) -> bool:
    """Poll ``read()`` every ``every_s`` until ``done`` of what it read or ``bound_s`` passed; whether done."""
    deadline = time.monotonic() + bound_s
    while not done(await read()):
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(every_s)
    return True


async def fill(q: DelayedQueue[Any], n: int, delay: float | Callable[[int], float], *, batch: int = 1000,
               keyed: bool = False, groups: int = 0) -> list[int]:
    """Items ``0 .. n-1`` (:func:`payload`) offered by ``offer_many`` calls of ``batch``, due after ``delay``
    (or ``delay(i)``) seconds, with the key ``order-i`` each when ``keyed``, in the group ``g<i % groups>``
    with ``groups``: their due times."""
    dues: list[int] = []
    for b in range(0, n, batch):
        ids = range(b, min(n, b + batch))
        dues += await q.offer_many([(payload(i), delay(i) if callable(delay) else delay) for i in ids],
                                   keys=[f"order-{i}" for i in ids] if keyed else None,
                                   groups=[f"g{i % groups}" for i in ids] if groups else None)
    return dues


async def produce_spread(send: Callable[[Any], Awaitable[list[int]]], now_ms: Callable[[], float],
                         due: dict[int, float], *, total: int, rate: float, bound_s: float, label: str,
                         start_offset_s: float = 0.5, lead_s: float = 0.5, tick_s: float = 0.05) -> int:
    """Make ``total`` items fall due at ``rate`` per second: item ``i`` targets ``start + start_offset_s +
    i / rate`` (``now_ms`` clock); every ``tick_s`` every item whose target is within ``lead_s`` is sent
    (``send``: a batch of at most 1000 ``(payload, delay s)``, returning due times). The due times go
    into ``due`` (by id); returns how many items were sent late (delay clamped to 0)."""
    loop = asyncio.get_running_loop()
    start_ms = now_ms()
    t0 = tick = loop.time()
    next_id = clamped = 0
    next_print = t0 + 2.0
    while next_id < total and loop.time() < t0 + bound_s:
        now = now_ms()
        batch: list[tuple[Any, float]] = []
        while next_id < total and len(batch) < 1000:
            target = start_ms + start_offset_s * 1000.0 + next_id * 1000.0 / rate
            if target > now + lead_s * 1000.0:
                break
            delay_s = (target - now) / 1000.0
            clamped += delay_s <= 0
            batch.append((payload(next_id), max(0.0, delay_s)))
            next_id += 1
        if batch:
            for (item, _), d in zip(batch, await send(batch), strict=True):
                due[item["order"]] = float(d)
            if len(batch) == 1000:
                continue
        if loop.time() >= next_print:
            log(f"      {label}: offered {next_id:,}/{total:,}")
            next_print += 2.0
        tick += tick_s
        await asyncio.sleep(max(0.0, tick - loop.time()))
    return clamped


# -- the context the scenarios share ----------------------------------------------------------------------


class Bench:
    """One run: its options, sizes, server, control client (``ctl``), ``SLOWLOG``, clock offset, seeded
    random numbers and the results so far; unique key names, clients and cleanup for the scenarios."""

    def __init__(self, args: argparse.Namespace, server: Server, sizes: Sizes) -> None:
        self.args, self.server, self.sizes, self.url = args, server, sizes, server.url
        self.token = secrets.token_hex(4)
        self.ctl = Redis.from_url(server.url, decode_responses=False)
        self.slowlog = SlowLog(self.ctl, server.owned or args.slowlog)
        self.offset_ms = 0.0
        self.results: dict[str, Any] = {}
        self.rng = random.Random(args.seed)
        self._names = 0

    def name(self, scenario: str, impl: str) -> str:
        self._names += 1
        return f"aiodelayq-bench:{self.token}:{scenario}:{impl}:{self._names}"

    def server_now_ms(self) -> float:
        return time.time() * 1000.0 + self.offset_ms

    def client(self, url: str | None = None) -> Redis:
        return Redis.from_url(url or self.url, decode_responses=False)

    @contextlib.asynccontextmanager
    async def fresh_queue(self, scenario: str, impl: str, *, clients: int = 1, url: str | None = None,
                          ctl: Redis | None = None) -> AsyncIterator[tuple[Any, ...]]:
        """``clients`` clients of their own (on the server at ``url``, ``ctl`` a client of it) and a new
        queue name: ``(*clients, name)``; on the way out the clients are closed and the queue's keys
        deleted."""
        opened = [self.client(url) for _ in range(clients)]
        name = self.name(scenario, impl)
        try:
            yield (*opened, name)
        finally:
            for client in opened:
                await client.aclose()
            await self.drop(name, client=ctl)

    async def drop(self, *names: str, client: Redis | None = None) -> None:
        """Delete every key of the given queues (ours and the reference use the same key names), on
        the run's server or on the one ``client`` talks to."""
        client = client or self.ctl
        keys = [key for n in names for key in DelayedQueue(client, n).keys.all]
        for i in range(0, len(keys), 1000):
            await client.unlink(*keys[i:i + 1000])

    async def machine(self) -> dict[str, Any]:
        cpu, commit = await asyncio.to_thread(_cpu_and_commit)
        info, memory = await self.ctl.info("server"), await self.ctl.info("memory")
        url = urlparse(self.url)
        return {"nproc": os.cpu_count(), "cpu": cpu, "platform": platform.platform(),
                "python": platform.python_version(), "redis_py": redis.__version__,
                "hiredis": getattr(sys.modules.get("hiredis"), "__version__", None),
                "server": {"kind": self.server.label, "server_name": str(info.get("server_name") or "redis"),
                           "server_version": str(info.get("valkey_version") or info.get("redis_version") or "?"),
                           "mem_allocator": str(memory.get("mem_allocator", "?")),
                           "url": url._replace(netloc=url.netloc.replace(f":{url.password}@", ":***@", 1)).geturl()
                           if url.password else self.url},
                "git": commit, "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}

    async def run(self, scenarios: Mapping[str, Scenario]) -> dict[str, Any]:
        """Run ``scenarios`` (name -> scenario function) in their order, a throwaway server restarted before
        each one, so that none runs on the heap an earlier one left. Returns the whole result (without
        bars and checks)."""
        t_start = time.perf_counter()
        await self.slowlog.setup()
        machine = await self.machine()
        # The server clock minus this one's (ms), from the TIME call with the smallest round trip, assuming
        # the server read its clock at its midpoint (error <= rtt / 2).
        offset_rtt = math.inf
        for _ in range(25):
            t0 = time.time() * 1000.0
            seconds, micros = await self.ctl.time()
            t1 = time.time() * 1000.0
            if t1 - t0 < offset_rtt:
                self.offset_ms, offset_rtt = (seconds * 1000.0 + micros / 1000.0) - (t0 + t1) / 2.0, t1 - t0
        srv = machine["server"]
        log(f"server: {srv['kind']} {srv['server_name']} {srv['server_version']} ({srv['mem_allocator']}) at "
            f"{srv['url']}; clock offset {self.offset_ms:+.3f} ms (TIME rtt {offset_rtt:.3f} ms); token {self.token}")
        log(f"machine: {machine['nproc']} CPUs ({machine['cpu']}), Python {machine['python']}, redis-py "
            f"{machine['redis_py']}, hiredis {machine['hiredis']}; SLOWLOG {'on' if self.slowlog.enabled else 'off'}")
        fresh = self.server.restart is not None and not self.args.same_server
        try:
            for n, (scenario, measure) in enumerate(scenarios.items()):
                log(f"== {scenario}")
                if n and fresh:
                    await self.ctl.connection_pool.disconnect()
                    await asyncio.to_thread(self.server.restart)
                    await self.ctl.ping()
                t0 = time.perf_counter()
                self.results[scenario] = await measure(self)
                self.results[scenario]["scenario_s"] = time.perf_counter() - t0
                log(f"   ({time.perf_counter() - t0:.1f} s)")
        finally:
            await self.slowlog.restore()
            async for key in self.ctl.scan_iter(match=f"*aiodelayq-bench:{self.token}:*", count=1000):
                await self.ctl.unlink(key)  # anything a failed scenario left
            await self.ctl.aclose()
        return {"machine": machine, "config": {**asdict(self.sizes), "quick": self.args.quick, "seed": self.args.seed,
                                               "clock_offset_ms": self.offset_ms, "slowlog": self.slowlog.enabled,
                                               "fresh_server_per_scenario": fresh},
                "scenarios": self.results, "total_s": time.perf_counter() - t_start}


Scenario = Callable[[Bench], Awaitable[dict[str, Any]]]
"""A scenario (one module of ``scenarios/``): takes the shared context, returns its result dict."""


def _cpu_and_commit() -> tuple[str, str]:
    cpu = commit = "?"
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "?")
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        commit = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=HERE, capture_output=True,
                                text=True, timeout=10).stdout.strip() or "?"
    return cpu, commit
