"""The contents of a sharded queue as one queue: counts summed over the shards, ``peek`` merged by
due time, ``contains``/``read_all``/``remove``/``remove_all``/``clear`` on every shard.

Every call goes to all shards at once. ``read_all`` is not merged by due time: a page walk returns none.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

from .._contents.contents import MAX_PEEK, PendingItem, QueueContents
from .._contents.counts import QueueCounts
from ..exceptions import ConfigurationError
from .fanout import on_every

__all__ = ["ShardedContents", "sum_counts"]


class ShardedContents:
    """``size``/``counts``/``peek``/... of a sharded queue object over its shards' contents."""

    def __init__(self, shards: Sequence[QueueContents]) -> None:
        self._shards = shards

    def __repr__(self) -> str:
        return f"<ShardedContents shards={len(self._shards)}>"

    async def size(self) -> int:
        """Pending elements of every shard."""
        return sum(await on_every(self._shards, QueueContents.size))

    async def ready_size(self) -> int:
        """Due items waiting in every shard's destination list."""
        return sum(await on_every(self._shards, QueueContents.ready_size))

    async def counts(self) -> QueueCounts:
        """Every shard's counts (each one atomic call), as one queue's (:func:`sum_counts`)."""
        return sum_counts(await on_every(self._shards, QueueContents.counts))

    async def peek(self, limit: int) -> list[PendingItem[Any]]:
        """The ``limit`` soonest-due pending items of all shards, soonest first.

        Raises:
            ConfigurationError: ``limit`` is not an ``int`` in 1..``MAX_PEEK``.
        """
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_PEEK:
            raise ConfigurationError(f"limit must be an int from 1 to {MAX_PEEK}, not {limit!r}")
        found = [item for items in await on_every(self._shards, lambda view: view.peek(limit)) for item in items]
        return sorted(found, key=lambda item: item.due_ms)[:limit]  # stable: a shard's own order kept

    async def contains(self, item: Any) -> bool:
        """Whether any shard has a pending element carrying ``item``."""
        return any(await on_every(self._shards, lambda view: view.contains(item)))

    async def read_all(self) -> list[Any]:
        """Every shard's pending items, each shard's in due order, shard after shard."""
        return [item for items in await on_every(self._shards, QueueContents.read_all) for item in items]

    async def remove(self, items: Iterable[Any], *, first_only: bool) -> int:
        """Remove elements matching ``items``: with ``first_only``, one (shard after shard, until one
        removes it); else every match, on every shard at once. Returns how many this call removed."""
        wanted = list(items)
        if not first_only:
            return sum(await on_every(self._shards, lambda view: view.remove(wanted, first_only=False)))
        for view in self._shards:
            removed = await view.remove(wanted, first_only=True)
            if removed:
                return removed
        return 0

    async def clear(self) -> None:
        """Drop every shard's pending elements."""
        await on_every(self._shards, QueueContents.clear)


def sum_counts(counts: Sequence[QueueCounts]) -> QueueCounts:
    """The counts of the shards as one queue's: pending, ready, in flight, dead letters, recurring and
    tiered items summed; the earliest due time and the largest lag; paused when any shard is (its consumers
    get nothing); the rate limit and burst summed over the shards that have one (``None`` when none
    has): the whole queue's, as ``set_rate_limit`` split it; likewise the concurrency limit; the keys
    held by deduplication windows summed."""
    dues = [c.next_due_ms for c in counts if c.next_due_ms is not None]
    rates = [c.rate_limit_per_s for c in counts if c.rate_limit_per_s is not None]
    bursts = [c.rate_burst for c in counts if c.rate_burst is not None]
    caps = [c.concurrency_limit for c in counts if c.concurrency_limit is not None]
    return QueueCounts(
        pending=sum(c.pending for c in counts), ready=sum(c.ready for c in counts),
        in_flight=sum(c.in_flight for c in counts), dead_letters=sum(c.dead_letters for c in counts),
        next_due_ms=min(dues) if dues else None, paused=any(c.paused for c in counts),
        rate_limit_per_s=round(math.fsum(rates), 9) if rates else None, rate_burst=sum(bursts) if bursts else None,
        recurring=sum(c.recurring for c in counts), lag_ms=max((c.lag_ms for c in counts), default=0),
        tiered=sum(c.tiered for c in counts), concurrency_limit=sum(caps) if caps else None,
        groups=sum(c.groups for c in counts), group_concurrency=max(c.group_concurrency for c in counts),
        deduplicating=sum(c.deduplicating for c in counts))
