"""The event stream of a sharded queue: each shard keeps its own (capped near ``maxlen`` each), and
reads merge them by time.

A stored read sorts every shard's events by their ids (server ms, then sequence); a following read
runs one reader per shard, owned by the iterator and stopped with it, and yields each event as its
shard's read returns it, so shards' events can interleave out of order by a few ms. ``start`` as an
entry id applies to every shard: the events after that time.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence

from .._contents.event_stream import EventStream, QueueEvent, check_start
from .._util.tasks import TaskOwner
from ..exceptions import BackendError
from .fanout import on_every

__all__ = ["ShardedEventStream"]


def _order(event: QueueEvent) -> tuple[int, int]:
    ms, _, n = event.id.partition("-")
    return int(ms), int(n or 0)


class ShardedEventStream:
    """``set_events``/``events()`` of a sharded queue object."""

    def __init__(self, shards: Sequence[EventStream]) -> None:
        self._shards = shards

    def __repr__(self) -> str:
        return f"<ShardedEventStream shards={len(self._shards)}>"

    async def set_maxlen(self, maxlen: int | None) -> None:
        """Every shard's stream on, capped near ``maxlen`` each, or off (see :meth:`EventStream.set_maxlen`)."""
        await on_every(self._shards, lambda shard: shard.set_maxlen(maxlen))

    async def last(self, n: int) -> list[QueueEvent]:
        """The last ``n`` events of all shards together, newest last."""
        got = await on_every(self._shards, lambda shard: shard.last(n))
        return sorted((e for events in got for e in events), key=_order)[-n:] if n else []

    async def read(self, start: str, follow: bool, closed: Callable[[], bool]) -> AsyncIterator[QueueEvent]:
        """As :meth:`EventStream.read`, over every shard (see the module docstring)."""
        check_start(start)
        if not follow:
            async def stored(shard: EventStream) -> list[QueueEvent]:
                return [e async for e in shard.read(start, False, closed)]

            for event in sorted((e for events in await on_every(self._shards, stored) for e in events), key=_order):
                yield event
            return
        if start == "$":  # each shard's newest, before any reader starts
            start_ids = await on_every(self._shards, EventStream.newest_id)
        else:
            start_ids = [start] * len(self._shards)
        came: asyncio.Queue[QueueEvent | BaseException] = asyncio.Queue()

        async def follow_shard(shard: EventStream, after: str) -> None:
            try:
                async for event in shard.read(after, True, closed):
                    came.put_nowait(event)
            except BackendError as exc:  # a permanent failure ends the whole read
                came.put_nowait(exc)

        owner = TaskOwner("events of a sharded queue")
        try:
            for shard, after in zip(self._shards, start_ids, strict=True):
                owner.spawn(follow_shard(shard, after), quiet=True)
            while not closed():
                got = await came.get()
                if isinstance(got, BaseException):
                    raise got
                yield got
        finally:
            await owner.aclose(asyncio.get_running_loop().time() + 5.0)
