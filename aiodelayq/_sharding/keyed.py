"""The calls about one key of a sharded queue (``cancel``, ``reschedule``, ``get``, ``schedule``), each on
the key's shard (:func:`.layout.shard_of`). A recurring item stays there: each occurrence is scheduled by the
call that hands the previous one out."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any

from .._producing.keyed import KeyedItems, Pending
from .._recurring.schedules import Schedules
from .._wire.item_keys import check_key
from .layout import shard_of

__all__ = ["ShardedKeyed", "ShardedSchedules"]


class ShardedKeyed:
    """``cancel``/``reschedule``/``get`` of a sharded queue object, each on the key's shard."""

    def __init__(self, shards: Sequence[KeyedItems]) -> None:
        self._shards = shards

    def __repr__(self) -> str:
        return f"<ShardedKeyed shards={len(self._shards)}>"

    def _of(self, key: str) -> KeyedItems:
        return self._shards[shard_of(check_key(key), len(self._shards))]

    async def cancel(self, key: str) -> bool:
        """Remove the pending item of ``key`` (see :meth:`KeyedItems.cancel`)."""
        return await self._of(key).cancel(key)

    async def reschedule(self, key: str, delay: float | timedelta) -> int | None:
        """Move the pending item of ``key`` (see :meth:`KeyedItems.reschedule`)."""
        return await self._of(key).reschedule(key, delay)

    async def get(self, key: str) -> Pending[Any] | None:
        """The pending item of ``key`` (see :meth:`KeyedItems.get`)."""
        return await self._of(key).get(key)


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
