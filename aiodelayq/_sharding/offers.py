"""Offers to a sharded queue: each item to its shard (:mod:`.layout`), through that shard's producer.

``offer_many`` checks and packs every item first (one bad item writes nothing), then sends each shard its
part concurrently. Each part is atomic, the whole list is not: one shard's failure can leave the other
shards' items written (the first failure is raised once every shard's call has ended).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any

from .._options import QueueOptions
from .._producing.dedupe import dedupe_key
from .._producing.producer import Producer
from .._scripts import QueueScripts
from .._util.observe import Events
from .._util.tasks import gather_all
from .._wire.elements import Fragment, entry_key
from .._wire.item_keys import check_group, check_key
from .layout import Rotation, shard_of

__all__ = ["ShardedProducer"]


class ShardedProducer:
    """``offer``/``offer_many`` of a sharded queue object over its shards' producers.

    ``scripts`` are those of the queue's own name: ``offer_many`` checks and packs there (spans are
    named after the queue), no item is written there.
    """

    def __init__(self, scripts: QueueScripts, options: QueueOptions, events: Events, shards: Sequence[Producer],
                 rotation: Rotation) -> None:
        self._shards = shards
        self._rotation = rotation
        self._router = Producer(scripts, options, events, send_many=self._send_many)
        self._codec = options.resolved_codec

    def __repr__(self) -> str:
        return f"<ShardedProducer shards={len(self._shards)} {self._rotation!r}>"

    def shard_for(self, key: str | None, group: str | None = None) -> int:
        """The shard of an item offered with ``key`` and ``group``: its group's, else its key's, else
        (neither) the next one of the rotation.

        Raises:
            InvalidKeyError: a bad key (InvalidGroupError: a bad group).
        """
        if group is not None:
            if key is not None:
                check_key(key)
            return shard_of(check_group(group), len(self._shards))
        if key is None:
            return self._rotation.next()
        return shard_of(check_key(key), len(self._shards))

    async def offer(self, item: Any, delay: float | timedelta, key: str | None = None, replace: bool = False,
                    headers: Mapping[str, str] | None = None, expires: float | timedelta | None = None,
                    group: str | None = None, dedupe_for: float | timedelta | None = None,
                    dedupe_by_content: bool = False) -> int:
        """One item, to its shard (see :meth:`Producer.offer`): with ``dedupe_by_content``, its
        content's key picks the shard."""
        key, _ = dedupe_key(self._codec, item, key, headers, dedupe_for, dedupe_by_content)
        return await self._shards[self.shard_for(key, group)].offer(item, delay, key, replace, headers, expires,
                                                                    group, dedupe_for)

    async def offer_many(self, pairs: Sequence[tuple[Any, float | timedelta]],
                         keys: Sequence[str | None] | None = None, replace: bool = False,
                         headers: Sequence[Mapping[str, str] | None] | None = None,
                         expires: float | timedelta | Sequence[float | timedelta | None] | None = None,
                         groups: Sequence[str | None] | None = None, dedupe_for: float | timedelta | None = None,
                         dedupe_by_content: bool = False) -> list[int]:
        """Many items, every one checked and packed first, then one ``offer_many`` part per shard
        touched, all sent at once; due times in input order."""
        return await self._router.offer_many(pairs, keys, replace, headers, expires, groups, dedupe_for,
                                             dedupe_by_content)

    async def _send_many(self, fragments: list[Fragment], entries: list[bytes] | None, issued: float,
                         groups: list[bytes | None] | None = None) -> list[int]:
        """Split packed items by shard (a grouped item's group, else a keyed item's key: its entry is
        a flag byte and the key) and send each shard its part; due times in input order."""
        parts: dict[int, list[int]] = {}
        count = len(self._shards)
        for index in range(len(fragments)):
            entry = entries[index] if entries is not None else b""
            group = groups[index] if groups is not None else None
            shard = (shard_of(group, count) if group else shard_of(entry_key(entry), count) if entry
                     else self._rotation.next())
            parts.setdefault(shard, []).append(index)

        async def send(shard: int, indexes: list[int]) -> list[int]:
            part_entries = None if entries is None else [entries[i] for i in indexes]
            part_groups = None if groups is None else [groups[i] for i in indexes]
            return await self._shards[shard].send_many([fragments[i] for i in indexes], part_entries, issued,
                                                        part_groups)

        results = await gather_all(send(shard, indexes) for shard, indexes in parts.items())
        dues: list[int] = [0] * len(fragments)
        for indexes, result in zip(parts.values(), results, strict=True):
            for index, due in zip(indexes, result, strict=True):
                dues[index] = due
        return dues

