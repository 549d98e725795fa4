"""Helpers shared by the tests: bounded waits, the server clock, a queue with a ready backlog, how
many callers wait on a queue, a queue for code that runs its own event loop, a child's first line,
and the scripts' packed lists."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import socket
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

from redis.asyncio import Redis

from aiodelayq import DelayedQueue
from aiodelayq._consuming.handoff import payloads

if TYPE_CHECKING:
    from aiodelayq.testing import ThrowawayCluster, ThrowawayServer
    from tests.faults import SubprocessConsumer


def free_socket() -> socket.socket:
    """A socket bound to a free loopback port (not listening yet)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    return sock


def unpack_list(blob: bytes) -> list[bytes]:
    """The strings of a list the scripts packed ('>I4' length-prefixed: a hand-off entry, whose '' is
    a tombstone; a key index entry after its version byte)."""
    out, pos = [], 0
    while pos + 4 <= len(blob):
        n = int.from_bytes(blob[pos:pos + 4], "big")
        out.append(blob[pos + 4:pos + 4 + n])
        pos += 4 + n
    return out


def handoff_payloads(blob: bytes) -> list[bytes]:
    """The payloads of a hand-off entry (``lua/lib/handoff.lua``): a packed list, or after byte 255 and
    '>I4' n, a packed list of n payloads, then fast elements (their payload after 29 bytes)."""
    if blob[:1] != b"\xff":
        return unpack_list(blob)
    return payloads(int.from_bytes(blob[1:5], "big"), 29, unpack_list(blob[5:]))


async def server_ms(r: Redis) -> float:
    """The server's clock in epoch milliseconds."""
    seconds, micros = await r.time()
    return seconds * 1000 + micros / 1000


async def script_calls(client: Redis) -> int:
    """Script calls the server has run so far (``INFO commandstats``)."""
    stats = await client.info("commandstats")
    return int(stats.get("cmdstat_evalsha", {}).get("calls", 0))


async def server_clock_at(r: Redis, clock: Callable[[], float], samples: int = 10) -> tuple[float, float]:
    """``(clock() in the middle of a TIME round trip, the server's epoch ms then)``, from the fastest
    of ``samples`` round trips: a busy machine's slow replies do not shift the pair."""
    best: tuple[float, float, float] | None = None
    for _ in range(samples):
        before = clock()
        now_ms = await server_ms(r)
        after = clock()
        if best is None or after - before < best[0]:
            best = (after - before, (before + after) / 2, now_ms)
    assert best is not None
    return best[1], best[2]


async def server_past(r: Redis, due_ms: int) -> bool:
    """Whether the server's clock is past ``due_ms``."""
    return await server_ms(r) > due_ms


async def until(predicate: Callable[[], Any], timeout_s: float = 5.0, interval_s: float = 0.01) -> None:
    """Wait until ``predicate()`` (sync or async) is truthy; fail after ``timeout_s``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        value = predicate()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return
        if loop.time() > deadline:
            raise AssertionError(f"condition not met within {timeout_s} s")
        await asyncio.sleep(interval_s)


@contextlib.asynccontextmanager
async def open_with_ready(client: Redis, q: DelayedQueue[Any], n: int) -> AsyncIterator[DelayedQueue[Any]]:
    """``q`` open, its destination list holding items ``0..n-1`` in that order (offered due now in one
    ``offer_many``, whose calls share its issue time, and moved)."""
    async with q:
        await q.offer_many([(i, 0) for i in range(n)])
        await until(lambda: llen_is(client, q, n), timeout_s=5)
        yield q


async def llen_is(client: Redis, q: DelayedQueue[Any], n: int) -> bool:
    """Whether ``q``'s destination list holds ``n`` items."""
    return int(await client.llen(q.keys.destination)) == n


async def dead_letters_are(q: DelayedQueue[Any], n: int) -> bool:
    """Whether ``q``'s dead-letter list holds ``n`` letters."""
    return len(await q.dead_letters()) == n


def takers_waiting(q: DelayedQueue[Any]) -> int:
    """How many ``take()``/``poll()``/``take_many()`` callers of the open queue ``q`` found nothing and
    wait for a wake-up (0 while its pump is still popping or about to)."""
    pump = q._life.pump()
    return 0 if pump._wake.is_set() else len(pump._waiters)


def receivers_waiting(q: DelayedQueue[Any]) -> int:
    """How many ``receive()`` callers of the open queue ``q`` found nothing and wait for a wake-up."""
    return q._life.reliable().waiting


async def first_line(child: SubprocessConsumer, timeout_s: float = 60.0) -> str:
    """The first line the child printed (waiting for it, bounded)."""
    return await child.await_line(lambda _line: True, timeout_s)


@contextlib.asynccontextmanager
async def queue_on(url: str, name: str, **options: Any) -> AsyncIterator[tuple[Redis, DelayedQueue[Any]]]:
    """A new client on ``url`` and a queue on it; after, the queue and the client are closed and the
    queue's keys deleted. For tests that run their own event loop per example (hypothesis), which the
    fixtures, bound to the test's loop, cannot serve."""
    client = Redis.from_url(url)
    q: DelayedQueue[Any] = DelayedQueue(client, name, **options)
    try:
        yield client, q
    finally:
        await q.aclose()
        await client.delete(*q.keys.all)
        await client.aclose()


async def migrate_under_load(q: DelayedQueue[int], migrate: Callable[[], int], *, warm: int,
                             pause_s: float) -> tuple[list[int], list[int], int]:
    """Offer 0, 1, 2, ... (each due in 50 ms, ``pause_s`` apart) to the open queue ``q`` while ``async
    for`` takes them; once ``warm`` items arrived, ``migrate()`` runs in a thread (it moves a slot and
    returns how many keys moved), then ``warm`` more offers go out. Returns ``(offered, got, moved)``
    once everything offered arrived or 15 s passed (what is missing then shows in the caller's
    assertion)."""
    offered: list[int] = []
    got: list[int] = []
    stop = asyncio.Event()

    async def produce() -> None:
        i = 0
        while not stop.is_set():
            await q.offer(i, 0.05)
            offered.append(i)
            i += 1
            await asyncio.sleep(pause_s)

    async def consume() -> None:
        async for item in q:
            got.append(item)

    consumer = asyncio.create_task(consume())
    producer = asyncio.create_task(produce())
    await until(lambda: len(got) >= warm, timeout_s=10)  # the load runs (counted, not timed)
    moved = await asyncio.to_thread(migrate)
    after = len(offered)
    await until(lambda: len(offered) >= after + warm, timeout_s=10)  # and goes on after the migration
    stop.set()
    await producer
    with contextlib.suppress(AssertionError):
        await until(lambda: len(got) >= len(offered), timeout_s=15)
    consumer.cancel()
    await asyncio.gather(consumer, return_exceptions=True)
    return offered, got, moved


class FailoverLoad:
    """Steady load for failover tests: a producer offering an increasing int every ~5 ms and a reliable
    consumer acking, both going on through errors; what happened is counted, and ``report`` gives the
    figures (new primary, longest pause in deliveries, failed offers, lost, duplicates)."""

    def __init__(self, q: DelayedQueue[int]) -> None:
        self.q = q
        self.confirmed: list[int] = []
        self.failed: list[int] = []
        self.reasons: set[str] = set()
        self.received: list[int] = []
        self.deliveries: list[tuple[float, int]] = []  # (loop time, value)
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    def __repr__(self) -> str:
        return f"<FailoverLoad confirmed={len(self.confirmed)} received={len(self.received)}>"

    @property
    def next_value(self) -> int:
        """The value of the producer's next (or current) offer."""
        return len(self.confirmed) + len(self.failed)

    async def __aenter__(self) -> FailoverLoad:
        self._tasks = [asyncio.create_task(self._produce()), asyncio.create_task(self._consume())]
        return self

    async def __aexit__(self, *exc: object) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _produce(self) -> None:
        i = 0
        while not self._stop.is_set():
            try:
                await self.q.offer(i, 0.05)
                self.confirmed.append(i)
            except Exception as exc:  # counted: an offer during the failover may fail
                self.failed.append(i)
                self.reasons.add(f"{type(exc).__name__}: {str(exc)[:100]}")
            i += 1
            await asyncio.sleep(0.005)

    async def _consume(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                batch = await self.q.receive_many(50, 5, timeout=1)
            except Exception:  # the consumer keeps going through the failover
                await asyncio.sleep(0.1)
                continue
            for m in batch:
                self.received.append(m.value)
                self.deliveries.append((loop.time(), m.value))
                with contextlib.suppress(Exception):  # an ack lost in the failover: redelivered later
                    await m.ack()

    async def kill_unreplicated_primary(self, cl: ThrowawayCluster, primary: ThrowawayServer, *, warm: int,
                                        label: str) -> str:
        """The failover that would lose writes without ``WAIT``, under this (running) load: once
        ``warm`` offers are confirmed, ``primary``'s replicas stop for 1.5 s and their links are cut
        (asleep, they cannot come back), and the primary dies once it has taken writes after the
        cut, so offers it took then never reach a replica. Returns once a replica took over, an
        offer made after the kill was received and ``warm`` more were confirmed, with production
        stopped (:meth:`finish`); returns the :meth:`report` line, headed ``label``."""
        from aiodelayq.testing.topologies import _cmd, _info
        from tests.faults import stall_server

        loop = asyncio.get_running_loop()
        await until(lambda: len(self.confirmed) >= warm, 20)  # the load runs (counted, not timed)
        stalls = [stall_server(r.url, 1.5) for r in cl.replicas_of(primary)]
        _cmd(primary.port, "CLIENT", "KILL", "TYPE", "replica")
        cut_at = _info(primary.port, "replication")["master_repl_offset"]
        await until(lambda: _info(primary.port, "replication")["master_repl_offset"] > cut_at, timeout_s=5)
        first_new, killed_at = self.next_value, loop.time()
        cl.kill(primary)
        await asyncio.to_thread(cl.wait_ok, 30)
        promoted_after_s = loop.time() - killed_at
        await until(lambda: any(v >= first_new for v in self.received), 20)
        after = len(self.confirmed)
        await until(lambda: len(self.confirmed) >= after + warm, 20)  # some load after the failover too
        stopped_at = await self.finish()
        for stall in stalls:
            stall.result(5)
        return self.report(label, promoted_after_s, killed_at, stopped_at)

    async def finish(self, timeout_s: float = 20.0) -> float:
        """Stop producing, wait until every confirmed offer was received (or ``timeout_s``), stop
        consuming; returns the loop time production stopped."""
        stopped_at = asyncio.get_running_loop().time()
        self._stop.set()
        await self._tasks[0]
        with contextlib.suppress(AssertionError):  # what never comes is reported as lost
            await until(lambda: set(self.confirmed) <= set(self.received), timeout_s)
        self._tasks[1].cancel()
        await asyncio.gather(self._tasks[1], return_exceptions=True)
        return stopped_at

    @property
    def lost(self) -> list[int]:
        """Confirmed offers never received."""
        return sorted(set(self.confirmed) - set(self.received))

    def longest_pause(self, since: float, until_t: float) -> float:
        """The longest time (s) without a delivery between ``since`` and ``until_t`` (loop times)."""
        times = [since, *sorted(t for t, _ in self.deliveries if since <= t <= until_t), until_t]
        return max((b - a for a, b in itertools.pairwise(times)), default=0.0)

    def report(self, label: str, promoted_s: float, since: float, until_t: float) -> str:
        """One line of failover figures for the test log (run with ``-s``)."""
        return (f"FAILOVER {label}: new primary after {promoted_s:.2f} s; deliveries paused at most "
                f"{self.longest_pause(since, until_t):.2f} s; {len(self.confirmed)} confirmed offers, "
                f"{len(self.failed)} failed {sorted(self.reasons)}, {len(self.lost)} lost, "
                f"{len(self.received) - len(set(self.received))} duplicates of {len(set(self.received))} messages")
