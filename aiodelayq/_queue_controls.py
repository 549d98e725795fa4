"""The calls of :class:`~aiodelayq.DelayedQueue` on its controls, for every consumer in every process
(``_consuming/controls.py``), delegated to the queue's controls part (``_parts/roles.py``)."""

from __future__ import annotations

from ._parts.roles import ControlCalls, EventCalls, Life

__all__ = ["ControlsCalls"]


class ControlsCalls:
    """Pause, resume, the rate limit, the concurrency limit and the group limit of a
    :class:`~aiodelayq.DelayedQueue`."""

    _life: Life
    _controls: ControlCalls
    _event_stream: EventCalls

    async def pause(self) -> None:
        """Pause every consumer of the queue, in every process, from its next call: ``take``,
        ``receive``, ``async for`` and workers hand nothing out (what a consumer already fetched, at
        most one round trip's prefetch, still goes out). Offers are accepted, and due items keep
        moving to the ready list. Kept in Redis until :meth:`resume`. Java consumers ignore it.

        Raises:
            BackendError: the call failed within ``call_timeout_s`` (resent: it is idempotent).
        """
        await self._life.enter()
        await self._controls.pause()

    async def resume(self) -> None:
        """Undo :meth:`pause`: consumers that wait get items again within 0.5 s plus a round trip.

        Raises:
            BackendError: the call failed within ``call_timeout_s``.
        """
        await self._life.enter()
        await self._controls.resume()

    async def is_paused(self) -> bool:
        """Whether the queue is paused (one read).

        Raises:
            BackendError: the read failed within ``call_timeout_s``.
        """
        await self._life.enter()
        return await self._controls.is_paused()

    async def set_rate_limit(self, per_second: float | None, burst: int | None = None) -> None:
        """Limit all consumers of the queue together, in every process, to ``per_second`` items a
        second, in bursts of at most ``burst`` (default: one second's worth, at least 1): at most
        ``burst + per_second * t`` items in any ``t`` seconds, a token bucket on the server clock
        that ``POP`` and ``RECEIVE`` take from. ``None`` removes the limit. Redelivered messages
        count too; Java consumers ignore it.

        Raises:
            ConfigurationError: ``per_second`` is not a finite number above 0 (or ``None``), or
                ``burst`` not an int >= 1; nothing is written.
            BackendError: the call failed within ``call_timeout_s``.
        """
        await self._life.enter()
        await self._controls.set_rate_limit(per_second, burst)

    async def set_concurrency_limit(self, limit: int | None) -> None:
        """Let the reliable consumers of the queue (``receive``, ``messages()``, a reliable worker),
        in every process together, hold at most ``limit`` messages at once; ``None`` removes the
        limit. A message is held from its delivery until it is acked, dead-lettered, released or
        nacked, or its visibility timeout ends; prefetched messages count, a nacked one waiting out
        its delay does not. ``RECEIVE`` applies it atomically; a consumer it refuses waits for an
        ack or a nack to make room (they publish a wake-up), or for the next visibility deadline.
        Lowering it below what is held takes nothing back. ``take`` holds nothing and is not
        counted; Java consumers ignore it. Kept in Redis; a sharded queue splits it over its shards.

        Raises:
            ConfigurationError: ``limit`` is not an int >= 1 (or ``None``); on a sharded queue, below
                its shard count; nothing is written.
            BackendError: the call failed within ``call_timeout_s``.
        """
        await self._life.enter()
        await self._controls.set_concurrency_limit(limit)

    async def set_group_concurrency(self, limit: int) -> None:
        """Let the reliable consumers of the queue, in every process together, hold at most ``limit``
        messages of one group (:meth:`offer`'s ``group``) at once; the default is 1: each group's
        items are handled one at a time, in order. The next item of a group is handed out once one
        in flight is acked or dead-lettered (a nacked or timed-out one stays first, and is delivered
        again before the next). Raising it lets the groups at the old limit hand out more at once
        (a wake-up is published); lowering it takes nothing back. Kept in Redis; on a sharded queue,
        in every shard.

        Raises:
            ConfigurationError: ``limit`` is not an int from 1 to 1,000,000; nothing is written.
            BackendError: the call failed within ``call_timeout_s``.
        """
        await self._life.enter()
        await self._controls.set_group_concurrency(limit)

    async def set_events(self, maxlen: int | None) -> None:
        """Turn the queue's event stream on, for every process, capped near ``maxlen`` entries, or off
        (``None``: the stream is deleted). While it is on, every script that changes an item appends
        one event for it in the same atomic call (:meth:`events`); while it is off nothing is written.
        Kept in Redis; a sharded queue keeps a stream per shard, each capped near ``maxlen``.

        Raises:
            ConfigurationError: ``maxlen`` is not an int >= 1 (or ``None``); nothing is written.
            BackendError: the call failed within ``call_timeout_s`` (resent: it is idempotent).
        """
        await self._life.enter()
        await self._event_stream.set_maxlen(maxlen)
