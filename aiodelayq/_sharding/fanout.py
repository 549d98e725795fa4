"""One call on every shard at once, for the whole-queue calls of a sharded queue."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

from .._util.tasks import gather_all

__all__ = ["on_every"]

S = TypeVar("S")
R = TypeVar("R")


async def on_every(shards: Sequence[S], call: Callable[[S], Awaitable[R]]) -> list[R]:
    """``call(shard)`` for every shard, concurrently; the results in shard order. Every call runs to
    its end (none is left running unowned), then the first failure, in shard order, is raised: the
    other shards' calls may have been applied."""
    return await gather_all(call(shard) for shard in shards)

