"""Helpers shared by the tests: bounded waits, the server clock, a queue with a ready backlog, a
queue for code that runs its own event loop, and a child's first line."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

from redis.asyncio import Redis

from aiodelayq import DelayedQueue

if TYPE_CHECKING:
    from tests.faults import SubprocessConsumer


async def server_ms(r: Redis) -> float:
    """The server's clock in epoch milliseconds."""
    seconds, micros = await r.time()
    return seconds * 1000 + micros / 1000


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
    """``q`` open, its destination list holding items ``0..n-1`` (offered due now, and moved)."""
    async with q:
        await q.offer_many([(i, 0) for i in range(n)])
        await until(lambda: llen_is(client, q, n), timeout_s=5)
        yield q


async def llen_is(client: Redis, q: DelayedQueue[Any], n: int) -> bool:
    """Whether ``q``'s destination list holds ``n`` items."""
    return int(await client.llen(q.keys.destination)) == n


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


def longest_pause(progress: list[tuple[float, int]], since: float, until_t: float) -> float:
    """The longest time (s) without a delivery between ``since`` and ``until_t`` (loop times), from
    ``(loop time, value)`` records of deliveries: how long a failover stopped delivery under load."""
    times = [since, *sorted(t for t, _ in progress if since <= t <= until_t), until_t]
    return max((b - a for a, b in itertools.pairwise(times)), default=0.0)


def failover_report(label: str, promoted_s: float, pause_s: float, confirmed: list[int], failed: list[int],
                    reasons: list[str], lost: list[int], received: list[int]) -> str:
    """One line of failover figures for the test log (run with ``-s``)."""
    return (f"FAILOVER {label}: new primary after {promoted_s:.2f} s; deliveries paused at most {pause_s:.2f} s; "
            f"{len(confirmed)} confirmed offers, {len(failed)} failed {sorted(set(reasons))}, {len(lost)} lost, "
            f"{len(received) - len(set(received))} duplicates of {len(set(received))} messages")
