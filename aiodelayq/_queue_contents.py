"""The calls of :class:`~aiodelayq.DelayedQueue` on what the queue holds, pending and ready, and on its
dead letters, delegated to the queue's contents and dead-letter parts (``_parts/roles.py``). They work
on a queue that was never opened."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from datetime import timedelta
from typing import Generic, TypeVar, cast

from ._contents.contents import PendingItem
from ._contents.counts import QueueCounts
from ._contents.dead_letters import DeadLetter
from ._contents.event_stream import QueueEvent
from ._parts.roles import Contents, DeadLetterCalls, EventCalls, Life
from ._util.checks import count

__all__ = ["ContentsCalls"]

T = TypeVar("T")


class ContentsCalls(Generic[T]):
    """Sizes, counts, peeks, walks, edits and the dead-letter list of a :class:`~aiodelayq.DelayedQueue`."""

    _life: Life
    _pending: Contents
    _dead: DeadLetterCalls
    _event_stream: EventCalls

    async def size(self) -> int:
        """Number of pending elements of every kind: the timeout zset's (``ZCARD``) and the tier's, in
        one read (Redisson's ``size()`` counts its insertion-order list, without fast elements).

        Raises:
            BackendError: the call failed within ``call_timeout_s`` (resends included).
        """
        await self._life.enter()
        return await self._pending.size()

    async def ready_size(self) -> int:
        """Number of due items waiting in the destination list (``LLEN``; grouped items waiting in
        their groups' lists count in :meth:`counts`'s ``ready``, not here)."""
        await self._life.enter()
        return await self._pending.ready_size()

    async def counts(self) -> QueueCounts:
        """Pending, ready, in-flight and dead-letter counts and the earliest due time
        (:class:`QueueCounts`), in one atomic read-only call: O(1) per count, O(log N) for the due
        time; what the CLI's ``stats`` and the metrics' gauges read.

        Raises:
            BackendError: the call failed within ``call_timeout_s`` (resends included).
        """
        await self._life.enter()
        return await self._pending.counts()

    # -- peeks, walks and edits of what is pending (Redisson's RDelayedQueue calls) --------------------

    async def peek(self, limit: int = 20) -> list[PendingItem[T]]:
        """The ``limit`` (1 to 1,000) soonest-due pending items, soonest first, with their due time
        and key; an item the codec cannot decode has ``value`` ``None`` and its ``raw`` bytes (a
        malformed element: ``malformed``). One read-only call, O(log N + limit). Tiered items
        (``tier_after_s``) are merged in by due time from the first buckets that may hold one of the
        ``limit`` soonest, reading at most 1,000 tiered items (a larger bucket is read from its
        first offered).

        Raises:
            ConfigurationError: a bad ``limit``. BackendError: the call failed.
        """
        await self._life.enter()
        return cast(list[PendingItem[T]], await self._pending.peek(limit))

    async def contains(self, item: T) -> bool:
        """Whether a pending element equals ``item`` (as encoded payload bytes). Walks in due order, then
        the tier's buckets, at most 1,000 elements (256 KiB) per script call, until a match; read-only.

        Raises:
            BackendError: a page call failed (each bounded by ``call_timeout_s``, resends included).
        """
        await self._life.enter()
        return await self._pending.contains(item)

    async def read_all(self) -> list[T]:
        """All pending items in due order (due time, then element bytes; fast elements due in the same
        millisecond in their producer's order), then the tiered ones (``tier_after_s``) bucket by
        bucket, each bucket in the order its items were offered; malformed ones skipped. Paged like
        :meth:`contains`; not a snapshot: an item that changes during the walk (falls due, is
        promoted from its bucket, is added or removed) may or may not be listed, none twice.

        Raises:
            DecodeError: a pending payload cannot be decoded by this queue's codec.
            BackendError: as :meth:`contains`.
        """
        await self._life.enter()
        return cast(list[T], await self._pending.read_all())

    async def remove(self, item: T) -> bool:
        """Cancel the first pending element equal to ``item`` in the order of :meth:`read_all`; ``True``
        only if this call removed it. The page that finds it removes it in the same script call, and a
        resent page answers as its first run did. Strict and legacy elements are also ``LREM``ed from
        Redisson's list (O(list), Redisson's cost); fast ones cost O(log N), tiered ones an ``LREM``
        from their bucket (O(bucket)).

        Raises:
            BackendError: a page call failed for good; ``maybe_applied`` says whether it may have
                removed the element.
        """
        await self._life.enter()
        return bool(await self._pending.remove([item], first_only=True))

    async def remove_all(self, items: Iterable[T]) -> bool:
        """Cancel every pending element equal to any of ``items`` in one paged walk; ``True`` if this
        call removed any. Raises as :meth:`remove`."""
        await self._life.enter()
        return bool(await self._pending.remove(items, first_only=False))

    async def clear(self) -> None:
        """Drop every pending element (both pending keys, and the tier's buckets in calls of up to 500
        buckets); the destination list is untouched.

        Raises:
            BackendError: a call failed within ``call_timeout_s`` (earlier calls' drops stay).
        """
        await self._life.enter()
        await self._pending.clear()

    # -- the dead-letter list (see _contents/dead_letters.py) ---------------------------------------------

    async def dead_letters(self, limit: int | None = None) -> list[DeadLetter[T]]:
        """The oldest ``limit`` entries of the dead-letter list (``None``: all), oldest first: each
        with its ``value`` (or ``raw`` bytes when undecodable), ``reason``, ``delivery_count`` and
        ``dead_at_ms``. An entry the library did not write reads as reason ``"malformed"``.

        Raises:
            ConfigurationError: a bad ``limit``. BackendError: the read failed.
        """
        await self._life.enter()
        return cast(list[DeadLetter[T]], await self._dead.read(limit))

    async def requeue_dead_letters(self, limit: int | None = None, delay: float | timedelta = 0) -> int:
        """Put the oldest ``limit`` entries (``None``: all there now) back into the queue, due after
        ``delay``, in their order; returns how many. Malformed entries (garbage elements, not
        payloads) are skipped and move to the tail of the list. At most 500 entries per script call,
        each applied once even when resent.

        Raises:
            ConfigurationError, InvalidDelayError: bad arguments. BackendError: a call failed (the
                entries of earlier calls are requeued).
        """
        await self._life.enter()
        return await self._dead.requeue(limit, delay)

    async def purge_dead_letters(self) -> int:
        """Delete the dead-letter list; returns how many entries it had. Raises ``BackendError``."""
        await self._life.enter()
        return await self._dead.purge()

    async def recent_events(self, limit: int = 50) -> list[QueueEvent]:
        """The last ``limit`` events stored (:meth:`set_events`), oldest first: one read (one per shard,
        merged by time); ``[]`` while the stream is off.

        Raises:
            ConfigurationError: ``limit`` is not an int >= 1. BackendError: the read failed within
                ``call_timeout_s``.
        """
        await self._life.enter()
        return await self._event_stream.last(count("limit", limit))

    async def events(self, start: str = "$", *, follow: bool = True) -> AsyncIterator[QueueEvent]:
        """The queue's events (:meth:`set_events` turns the stream on), oldest first, as
        :class:`QueueEvent`: after ``start``, which is ``"$"`` (only what comes from now on),
        ``"0"`` or ``"-"`` (everything stored) or an event's ``id`` (what came after it). With
        ``follow=False`` it yields what is stored and stops; with ``follow=True`` it then waits for
        new events (blocking reads of at most 1 s, each on a connection of its own while it blocks;
        cancelling the iteration drops that connection) until the queue object closes. A following
        read retries failures at the backoff's pace and logs them; it raises a permanent one. The
        stream is capped: a slow reader can miss events trimmed before it read them. On a sharded
        queue the shards' events are merged by time.

        Raises:
            ConfigurationError: a ``start`` of another form; nothing is read.
            AccessDeniedError, WrongNodeError: a permanent failure.
            BackendError: with ``follow=False``, a read failed within ``call_timeout_s``.
        """
        await self._life.enter()
        life = self._life
        async for event in self._event_stream.read(start, follow, lambda: life.state in ("closing", "closed")):
            yield event
