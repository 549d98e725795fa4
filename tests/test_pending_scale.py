"""contains/read_all/remove with a million pending elements: no script call holds the server long.

The walks page over the timeout zset, one short script call per page. SLOWLOG gives the server time
of every page over 1 ms, INFO commandstats the mean; a PING sent every 2 ms from another process
during the walks shows what other clients see.

Timing on a shared 2-core machine is noisy: the server can be descheduled in the middle of a page,
which SLOWLOG counts as that page's time. So every walk runs several times over the same pages
(contains and remove of an absent item, and read_all, visit identical pages), and a page's cost is
its fastest run: noise lands on different pages each time, a page that is really slow is slow every
time. (Logging every call instead, threshold 0, made it worse on the wheel-built servers, which use
glibc malloc: freeing a thousand log entries at SLOWLOG RESET stalled a later command by ~20 ms.)
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from redis.asyncio import Redis

from aiodelayq import DelayedQueue
from aiodelayq._redis.connections import Script, call
from aiodelayq._scripts import CONTAINS_PAGE, PAGE_SIZE, READ_PAGE, REMOVE_PAGE

pytestmark = pytest.mark.slow

N = 1_000_000
BAR_MS = 5.0  # the requirement: server time of one script call
TOLERANCE_MS = 8.0  # what the test asserts: the bar plus room for a noisy machine
LOGGED_MS = 1.0  # SLOWLOG threshold
# What a client sees: a PING every 2 ms from another process during the walks. The server-time bounds
# above are the check (a PING waits for at most one page); this one only says the server stayed
# responsive for almost every PING, and allows for a busy 2-core machine: next to another test
# session here, p99 went over 10 ms while every page stayed under 5 ms of server time.
PING_P99_MS = 50.0

# Pings the server every 2 ms until its stdin closes, then prints the round trips (ms) as JSON.
_PINGER = r"""
import json, select, socket, sys, time
sock = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
print("ready", flush=True)
rtts = []
while not select.select([sys.stdin], [], [], 0.002)[0]:
    t = time.perf_counter()
    sock.sendall(b"PING\r\n")
    reply = b""
    while not reply.endswith(b"\r\n"):
        reply += sock.recv(64)
    rtts.append((time.perf_counter() - t) * 1000)
print(json.dumps(rtts), flush=True)
"""


async def _load(q: DelayedQueue[str]) -> None:
    """N fast elements through the producer (offer_many, 1000 per call, 8 calls in flight), due in
    an hour plus up to 10 minutes: about 1.7 per ms, so many share a score."""
    rng = random.Random(1)
    slots = asyncio.Semaphore(8)

    async def chunk(start: int) -> None:
        async with slots:
            await q.offer_many([(f"item-{i:07d}", 3600 + rng.random() * 600) for i in range(start, start + 1000)])

    await asyncio.gather(*(chunk(s) for s in range(0, N, 1000)))


async def _walk_costs(admin: Redis, script: Script, walk: Callable[[], Awaitable[Any]],
                      runs: int) -> tuple[list[float], float, float]:
    """Run ``walk`` ``runs`` times over the same pages. Returns each run's slowest page, the slowest
    page when each page counts its fastest run, and the mean page (ms of server time).

    SLOWLOG logs the pages over ``LOGGED_MS``, identified by their arguments (the cursor; not a
    remove page's call id); a page missing from some run's log took less than ``LOGGED_MS`` then.
    """
    logged: list[dict[tuple[bytes, ...], float]] = []
    total_usec = calls = 0
    for _ in range(runs):
        await admin.config_resetstat()
        await admin.slowlog_reset()
        await walk()
        # Raw entries (the library's own call: no reply parsing): [id, time, µs, args, ...].
        entries = await call(admin, "SLOWLOG", "GET", 100_000, what="slowlog", timeout_s=10)
        pages = {}
        for entry in entries:
            args = entry[3]
            if args[:2] == [b"EVALSHA", script.sha.encode()]:
                key = tuple(a for i, a in enumerate(args) if not (script is REMOVE_PAGE and i == 7))
                pages[key] = entry[2] / 1000
        logged.append(pages)
        stats = (await admin.info("commandstats"))["cmdstat_evalsha"]
        total_usec += stats["usec"]
        calls += stats["calls"]
    raw = [max(pages.values(), default=0.0) for pages in logged]
    in_every_run = set(logged[0]).intersection(*logged[1:])
    filtered = max((min(pages[key] for pages in logged) for key in in_every_run), default=0.0)
    return raw, filtered, total_usec / calls / 1000


async def test_walks_over_a_million_pending_never_hold_the_server(own_server: Any, make_client: Any,
                                                                  make_queue: Any) -> None:
    server = own_server()
    admin = make_client(server)
    q: DelayedQueue[str] = make_queue("scale", redis=make_client(server, max_connections=32), codec="str")
    started = time.perf_counter()
    await _load(q)
    assert await q.size() == N
    loaded = time.perf_counter() - started
    for script in (CONTAINS_PAGE, REMOVE_PAGE, READ_PAGE):
        await admin.script_load(script.text)  # else a first run's NOSCRIPT attempt counts as a page
    await admin.config_set("slowlog-log-slower-than", int(LOGGED_MS * 1000))
    await admin.config_set("slowlog-max-len", 100_000)
    pinger = await asyncio.create_subprocess_exec(sys.executable, "-c", _PINGER, str(server.port),
                                                  stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)
    try:
        assert pinger.stdout is not None
        assert (await pinger.stdout.readline()).strip() == b"ready"
        walk_started = time.perf_counter()
        contains = await _walk_costs(admin, CONTAINS_PAGE, lambda: _false(q.contains("absent")), runs=3)
        remove = await _walk_costs(admin, REMOVE_PAGE, lambda: _false(q.remove("absent")), runs=3)
        walked = time.perf_counter() - walk_started
    finally:
        out, _ = await asyncio.wait_for(pinger.communicate(b""), 30)  # EOF on its stdin ends it
    rtts = sorted(json.loads(out.decode().strip().splitlines()[-1]))
    read = await _walk_costs(admin, READ_PAGE, lambda: _count(q.read_all()), runs=3)
    assert await q.size() == N
    p99 = rtts[int(len(rtts) * 0.99)]
    costs = {"contains": contains, "remove": remove, "read_all": read}
    report = "; ".join(
        [f"{N:,} pending (loaded in {loaded:.1f} s), pages of {PAGE_SIZE}; server ms per page: slowest "
         "(each page at its fastest run) / slowest raw per run / mean"]
        + [f"{label} {filtered:.2f} / {[round(r, 2) for r in raw]} / {mean:.2f}".replace(
            " 0.00 /", f" <{LOGGED_MS:.2f} /")
           for label, (raw, filtered, mean) in costs.items()]
        + [f"{len(rtts)} PINGs during {walked:.1f} s of contains/remove walks: p50 {_median(rtts):.2f}, "
           f"p99 {p99:.2f}, max {rtts[-1]:.2f} ms; total {time.perf_counter() - started:.1f} s"])
    print(report)
    for label, (_, filtered, mean) in costs.items():
        assert filtered <= TOLERANCE_MS, f"{label}: a page took {filtered:.2f} ms of server time; {report}"
        assert mean <= BAR_MS / 2, report
    assert p99 <= PING_P99_MS, report


async def _false(result: Awaitable[bool]) -> None:
    assert await result is False


async def _count(result: Awaitable[list[Any]]) -> None:
    assert len(await result) == N


def _median(values: list[float]) -> float:
    return sorted(values)[len(values) // 2]
