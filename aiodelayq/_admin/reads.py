"""A queue as an operator reads it, with bounded, read-only calls."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Coroutine, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .._contents.counts import QueueCounts
from .._queue import DelayedQueue
from .._redis.connections import AnyRedis
from .._redis.retry import call_idempotent
from .._wire.key_names import QueueKeys
from .._wire.placement import ShardRecord
from .connect import SOCKET_TIMEOUT_S

__all__ = ["COUNT_CONCURRENCY", "QueueRow", "count_each", "queue_counts", "queue_exists", "recorded_shards",
           "server_now_ms", "with_queue"]

# Queues counted at once by `stats`, `ls` and the dashboard's index: enough to hide round trips, few
# enough connections.
COUNT_CONCURRENCY = 16


@dataclass(frozen=True)
class QueueRow:
    """One queue's counts as ``stats``, ``watch`` and ``ls`` show them."""

    name: str
    counts: QueueCounts


@contextlib.asynccontextmanager
async def with_queue(client: AnyRedis, name: str, codec: str = "bytes",
                     shards: int | None = None) -> AsyncIterator[DelayedQueue[Any]]:
    """A queue object on ``client``, never opened (a command or a page only reads and writes), closed on
    exit; a sharded queue's covers all its shards (``shards``: the count when the caller knows it, else
    :func:`recorded_shards` reads it). ``codec`` only matters where items are decoded or encoded."""
    if shards is None:
        shards = (await recorded_shards(client, name)).count
    queue: DelayedQueue[Any] = DelayedQueue(client, name, codec=codec, shards=shards)
    try:
        yield queue
    finally:
        await queue.aclose()


async def recorded_shards(client: AnyRedis, name: str) -> ShardRecord:
    """What the queue name ``name`` records about its shards (one ``HGET`` of its controls hash):
    their count and placement (``_wire/placement.py``); a count of 1 for an ordinary queue's name, a
    name with a brace (never sharded) or a record this release cannot read."""
    if "{" in name or "}" in name:
        return ShardRecord(1)
    controls = QueueKeys.for_name(name).controls
    raw = await call_idempotent(client, "HGET", controls, "shards", what=f"the shard count of {name!r}",
                                timeout_s=SOCKET_TIMEOUT_S, route=controls)
    return ShardRecord.parse(raw) or ShardRecord(1)


async def server_now_ms(client: AnyRedis, route: str | None = None) -> int:
    """The server's clock in epoch ms: due times are on it, so "in 12 s" must be too. ``route``: a
    key whose node answers (on a Cluster, the queue's own clock)."""
    seconds, micros = await call_idempotent(client, "TIME", what="TIME", timeout_s=SOCKET_TIMEOUT_S, route=route)
    return int(seconds) * 1000 + int(micros) // 1000


def count_each(client: AnyRedis, names: Iterable[str],
               shards: Mapping[str, int] | None = None) -> list[Coroutine[Any, Any, QueueCounts]]:
    """One coroutine per queue of ``names`` that reads its ``counts()`` (one atomic read-only call), at
    most :data:`COUNT_CONCURRENCY` of them at once: the caller gathers them and decides what a failure
    means. ``shards``: the shard counts of the sharded ones (:attr:`.scan.ScanResult.shards`;
    a name it lacks is an ordinary queue's), else each queue's is read first."""
    gate = asyncio.Semaphore(COUNT_CONCURRENCY)

    async def one(name: str) -> QueueCounts:
        async with gate, with_queue(client, name, shards=None if shards is None else shards.get(name, 1)) as queue:
            return await queue.counts()

    return [one(name) for name in names]


async def queue_counts(client: AnyRedis, names: Sequence[str],
                       shards: Mapping[str, int] | None = None) -> list[QueueRow]:
    """The counts of each queue (:func:`count_each`), in input order; the first failure is raised."""
    counts = await asyncio.gather(*count_each(client, names, shards))
    return [QueueRow(name, each) for name, each in zip(names, counts, strict=True)]


async def queue_exists(client: AnyRedis, name: str) -> bool:
    """Whether any key of the queue ``name`` exists (one ``EXISTS``; a queue's keys share one
    cluster slot). ``False`` for a misspelt name, and also for an idle queue: a queue with nothing
    pending, ready, in flight or dead and no controls keeps no key at all."""
    keys = QueueKeys.for_name(name)
    found = await call_idempotent(client, "EXISTS", *keys.all, what=f"EXISTS of {name!r}'s keys",
                                  timeout_s=SOCKET_TIMEOUT_S, route=keys.timeout_set)
    return bool(found)

