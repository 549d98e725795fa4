"""The calls about one key of a sharded queue (``cancel``, ``reschedule``, ``get``, ``schedule``), each on
the key's shard (:func:`.layout.shard_of`). A recurring item stays there: each occurrence is scheduled by the
call that hands the previous one out. A keyed item with a group lives in its group's shard instead: a call
that finds nothing in the key's shard looks in the others, in order."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import timedelta
from typing import Any, TypeVar

from .._producing.keyed import KeyedItems, Pending
from .._recurring.schedules import Schedules
from .._wire.item_keys import check_key
from .layout import shard_of

__all__ = ["ShardedKeyed", "ShardedSchedules"]

R = TypeVar("R")


class ShardedKeyed:
    """``cancel``/``reschedule``/``get`` of a sharded queue object, each on the key's shard."""

    def __init__(self, shards: Sequence[KeyedItems]) -> None:
        self._shards = shards

    def __repr__(self) -> str:
        return f"<ShardedKeyed shards={len(self._shards)}>"

    def _in_turn(self, key: str) -> list[KeyedItems]:
        """The shards to ask about ``key``: its own first (a grouped item's is its group's), then the others."""
        home = shard_of(check_key(key), len(self._shards))
        return [self._shards[home], *(shard for i, shard in enumerate(self._shards) if i != home)]

    async def _first(self, key: str, call: Callable[[KeyedItems], Awaitable[R]], missing: R) -> R:
        """``call`` on the shards of ``key`` in turn (:meth:`_in_turn`): the first answer that is not
        ``missing`` (the key's item is not there), else ``missing``."""
        for shard in self._in_turn(key):
            if (found := await call(shard)) is not missing:
                return found
        return missing

    async def cancel(self, key: str) -> bool:
        """Remove the pending item of ``key`` (see :meth:`KeyedItems.cancel`)."""
        return await self._first(key, lambda shard: shard.cancel(key), False)

    async def reschedule(self, key: str, delay: float | timedelta) -> int | None:
        """Move the pending item of ``key`` (see :meth:`KeyedItems.reschedule`)."""
        return await self._first(key, lambda shard: shard.reschedule(key, delay), None)

    async def get(self, key: str) -> Pending[Any] | None:
        """The pending item of ``key`` (see :meth:`KeyedItems.get`)."""
        return await self._first(key, lambda shard: shard.get(key), None)


class ShardedSchedules:
    """``schedule`` of a sharded queue object, on the key's shard."""

    def __init__(self, shards: Sequence[Schedules]) -> None:
        self._shards = shards

    def __repr__(self) -> str:
        return f"<ShardedSchedules shards={len(self._shards)}>"

    async def schedule(self, key: str, item: Any, *, every: float | timedelta | None, cron: str | None,
                       tz: str | None, headers: Mapping[str, str] | None) -> int:
        """Start (or replace) the recurring item of ``key`` (see :meth:`Schedules.schedule`)."""
        shard = self._shards[shard_of(check_key(key), len(self._shards))]
        return await shard.schedule(key, item, every=every, cron=cron, tz=tz, headers=headers)
