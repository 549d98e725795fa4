"""The public :class:`DelayedQueue`: options, state and lifecycle; the work is delegated to
``_producer`` (offers), ``_take`` (plain consuming), ``_reliable`` (receive/ack) and ``_pending``
(the pending side)."""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Generic, Literal, TypeVar, cast

from anyio.abc import AsyncResource
from redis.asyncio import Redis

from ._codec import Codec, decode_item, resolve_codec
from ._delays import check_timeout, delay_to_ms
from ._eviction import check_eviction_policy
from ._keys import QueueKeys
from ._pending import PendingView
from ._producer import Producer
from ._registry import acquire_scheduler, release_scheduler
from ._reliable import Message, MessageIterator, ReliableConsumer
from ._scheduler import TransferScheduler
from ._take import TakePump
from .exceptions import (
    ConfigurationError,
    InvalidDelayError,
    QueueClosedError,
    QueueNotOpenError,
    WrongEventLoopError,
)

__all__ = ["DelayedQueue", "QueueStats", "WireFormat"]

log = logging.getLogger("aiodelayq")

T = TypeVar("T")
_Q = TypeVar("_Q", bound="DelayedQueue[Any]")

WireFormat = Literal["redisson", "redisson-legacy"]
"""How this producer packs pending elements: ``"redisson"`` (Redisson >= 3.21.1, ``Bc0Lc0``) or
``"redisson-legacy"`` (older Redisson, ``dLc0``). Reading always accepts both."""


@dataclass(frozen=True)
class QueueStats:
    """Counters of one queue in this process.

    Attributes:
        transfers: transfer script runs by this process's scheduler for the queue.
        moved: items this process moved from pending to the destination list.
        dead_lettered: malformed pending elements moved to the dead-letter list.
        undecodable: popped payloads the codec could not decode (moved to the dead-letter list).
        transfer_errors: failed transfer attempts (retried with backoff).
        returned: popped items handed back to the list because their caller had gone.
        recovered: popped items whose consumer did not finish with them within the hand-off lease,
            returned to the head of the list by this process's transfers.
        exhausted: messages this queue object moved to the dead-letter list because they ran out
            of deliveries (``max_deliveries``), or were not message elements.
    """

    transfers: int
    moved: int
    dead_lettered: int
    undecodable: int
    transfer_errors: int
    returned: int
    recovered: int = 0
    exhausted: int = 0


class DelayedQueue(AsyncResource, Generic[T]):
    """A delayed queue on Redis that shares keys and element format with Redisson's ``RDelayedQueue``.

    Producers (``offer``/``offer_many``) and the pending-side calls work without opening the queue.
    Consumers open it (``async with queue:``), which starts this event loop's transfer scheduler
    and pub/sub subscriber for the queue, then ``take``/``poll``/``async for``.

    A queue object belongs to the event loop of its first call (:class:`WrongEventLoopError` from
    any other; a producer-only queue moves on once that loop is closed).

    Args:
        client: a ``redis.asyncio.Redis`` with ``decode_responses=False`` (payloads are bytes).
        name: the destination list, Redisson's queue name; may contain a ``{hash tag}``.
        codec: ``"json"`` (default), ``"str"``, ``"bytes"``, ``"msgpack"`` or an object with
            ``encode(obj) -> bytes`` and ``decode(bytes) -> obj``.
        wire_format: how this producer packs elements (see :data:`WireFormat`).
        strict: also keep this producer's elements in Redisson's insertion-order list, exactly as
            Redisson does, so Java's ``size()``/``readAll()``/``contains()``/``remove()`` see them. The
            default (fast) keeps them in the zset only: no O(backlog) ``LREM`` when they fall due.
            ``wire_format="redisson-legacy"`` is always strict (its layout has no room for the marker).
        max_deliveries: for :meth:`receive`: a message delivered this many times and still not acked
            goes to the dead-letter list instead of a further delivery (``None``: no limit).
        transfer_batch: most elements one transfer script call moves (Redisson uses 100; 500 fast
            elements take about 2 ms of server time with a million pending).
        safety_poll_s: seconds between transfers when nothing else wakes the scheduler; bounds the
            stall after a lost pub/sub message.
        open_timeout_s: bound of ``open()`` (subscribe + first transfer), seconds.
        close_timeout_s: bound of ``aclose()``, seconds.
        call_timeout_s: bound of every Redis call a method makes, resends included, seconds (an
            ``offer`` in a web handler never hangs on a stalled server): :class:`CallTimeoutError`,
            whose ``maybe_applied`` says whether the write may still have been applied.
        max_call_bytes: most bytes of encoded items one offer call carries (items beyond go in
            further calls; one larger item goes alone). Keep it under the server's
            ``proto-max-bulk-len`` (512 MB by default).

    Raises:
        InvalidNameError: empty or non-``str`` name.
        ConfigurationError: a bad option or a client that decodes responses.
    """

    def __init__(
        self,
        client: Redis,
        name: str,
        *,
        codec: str | Codec = "json",
        wire_format: WireFormat = "redisson",
        strict: bool = False,
        max_deliveries: int | None = None,
        transfer_batch: int = 500,
        safety_poll_s: float = 5.0,
        open_timeout_s: float = 10.0,
        close_timeout_s: float = 5.0,
        call_timeout_s: float = 5.0,
        max_call_bytes: int = 1_000_000,
    ) -> None:
        self._keys = QueueKeys.for_name(name)
        if not isinstance(client, Redis):
            raise ConfigurationError(f"client must be a redis.asyncio.Redis, not {type(client).__name__}")
        if client.connection_pool.connection_kwargs.get("decode_responses"):
            raise ConfigurationError("the client must not decode responses: use decode_responses=False")
        if wire_format not in ("redisson", "redisson-legacy"):
            raise ConfigurationError(f"wire_format must be 'redisson' or 'redisson-legacy', not {wire_format!r}")
        if max_deliveries is not None and (not isinstance(max_deliveries, int) or max_deliveries < 1):
            raise ConfigurationError("max_deliveries must be None or an int >= 1")
        if not isinstance(transfer_batch, int) or not 1 <= transfer_batch <= 10_000:
            raise ConfigurationError("transfer_batch must be an int in 1..10000")
        if not isinstance(max_call_bytes, int) or max_call_bytes < 1024:
            raise ConfigurationError("max_call_bytes must be an int >= 1024")
        for label, value in (("safety_poll_s", safety_poll_s), ("open_timeout_s", open_timeout_s),
                             ("close_timeout_s", close_timeout_s), ("call_timeout_s", call_timeout_s)):
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 < value < math.inf:
                raise ConfigurationError(f"{label} must be a positive number of seconds")
        try:
            self._codec = resolve_codec(codec)
        except (TypeError, ValueError) as exc:
            raise ConfigurationError(str(exc)) from exc
        self._client = client
        self._wire_format: WireFormat = wire_format
        kind = "legacy" if wire_format == "redisson-legacy" else ("current" if strict else "fast")
        self._strict = kind != "fast"
        self._batch = transfer_batch
        self._max_deliveries = max_deliveries or 0
        self._safety_poll_s = float(safety_poll_s)
        self._open_timeout_s = float(open_timeout_s)
        self._close_timeout_s = float(close_timeout_s)
        self._call_timeout_s = float(call_timeout_s)
        self._producer = Producer(client, self._keys, self._codec, kind=kind, call_timeout_s=self._call_timeout_s,
                                  max_call_bytes=max_call_bytes)
        self._pending = PendingView(client, self._keys, self._codec, call_timeout_s=self._call_timeout_s)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._state: Literal["new", "opening", "open", "closing", "closed"] = "new"
        self._opening: asyncio.Task[None] | None = None
        self._openers = 0
        self._close_task: asyncio.Task[None] | None = None
        self._scheduler: TransferScheduler | None = None
        self._pump: TakePump | None = None
        self._reliable: ReliableConsumer[T] | None = None

    # -- identity --------------------------------------------------------------------------------

    @property
    def name(self) -> str:
        """The queue name (the destination list key)."""
        return self._keys.destination

    @property
    def keys(self) -> QueueKeys:
        """The Redis keys this queue uses."""
        return self._keys

    @property
    def wire_format(self) -> WireFormat:
        """How this producer packs elements."""
        return self._wire_format

    @property
    def strict(self) -> bool:
        """Whether this producer keeps its elements in Redisson's insertion-order list."""
        return self._strict

    @property
    def is_open(self) -> bool:
        """Whether ``take``/``poll``/iteration can be used now."""
        return self._state == "open"

    @property
    def stats(self) -> QueueStats:
        """A snapshot of this process's counters for the queue."""
        s = self._scheduler.stats if self._scheduler else None
        pump, reliable = self._pump, self._reliable
        return QueueStats(
            transfers=s.transfers if s else 0,
            moved=s.moved if s else 0,
            dead_lettered=s.dead_lettered if s else 0,
            undecodable=(pump.undecodable if pump else 0) + (reliable.undecodable if reliable else 0),
            transfer_errors=s.errors if s else 0,
            returned=pump.returned if pump else 0,
            recovered=s.recovered if s else 0,
            exhausted=reliable.exhausted if reliable else 0,
        )

    def __repr__(self) -> str:
        return f"<DelayedQueue {self.name!r} {self._state}>"

    def _bind_loop(self) -> None:
        loop = asyncio.get_running_loop()
        if self._loop is loop:
            return
        if self._loop is None or (self._loop.is_closed() and self._state == "new"):
            self._loop = loop
            self._producer.rebind()
            return
        raise WrongEventLoopError(
            f"queue {self.name!r} is bound to the event loop of its first use; it cannot be used from "
            "another one (create one DelayedQueue, and one redis client, per event loop)")

    # -- lifecycle -------------------------------------------------------------------------------

    async def open(self: _Q) -> _Q:
        """Start consuming: subscribe, run the compensating transfer and arm the scheduler.

        Returns once the first transfer has succeeded. Opening an already open queue is a no-op;
        concurrent openers share one opening, and a cancelled opener only stops waiting (the last
        one to leave cancels the opening).

        Raises:
            BackendError: Redis could not be reached within ``open_timeout_s``.
            AccessDeniedError: the user lacks a permission the queue needs (see the docs' ACL).
            QueueClosedError: the queue was closed (a queue is opened at most once).
            WrongEventLoopError: called from another event loop than the queue's.
        """
        self._bind_loop()
        if self._state == "open":
            return self
        if self._state in ("closing", "closed"):
            raise QueueClosedError(f"queue {self.name!r} is {self._state}; create a new DelayedQueue")
        if self._opening is None:
            self._state = "opening"
            self._opening = asyncio.get_running_loop().create_task(self._open(), name=f"aiodelayq-open:{self.name}")
        opening = self._opening
        self._openers += 1
        try:
            await asyncio.wait({opening})
        except asyncio.CancelledError:
            self._openers -= 1
            if self._openers == 0 and not opening.done():
                opening.cancel()  # nobody waits any more: do not open behind everyone's back
            raise
        self._openers -= 1
        if opening.cancelled() or self._state in ("closing", "closed"):
            raise QueueClosedError(f"queue {self.name!r} was closed while opening")
        opening.result()
        return self

    async def _open(self) -> None:
        try:
            check_eviction_policy(self._client)
            scheduler = await acquire_scheduler(
                self._client, self._keys, batch=self._batch, safety_poll_s=self._safety_poll_s,
                open_timeout_s=self._open_timeout_s, call_timeout_s=self._call_timeout_s)
        except BaseException:
            if self._state == "opening":
                self._state = "new"
            self._opening = None
            raise
        if self._state != "opening":  # aclose() ran while we were opening
            await release_scheduler(self._client, self._keys, self._close_timeout_s)
            raise QueueClosedError(f"queue {self.name!r} was closed while opening")
        self._scheduler = scheduler
        self._pump = TakePump(self._client, self._keys, decode=lambda raw: decode_item(self._codec, raw),
                              slots=scheduler.slots, call_timeout_s=self._call_timeout_s)
        self._reliable = ReliableConsumer(self._client, self._keys, self._codec,
                                          max_deliveries=self._max_deliveries, call_timeout_s=self._call_timeout_s)
        scheduler.listeners.extend((self._pump.notify, self._reliable.notify))
        self._state = "open"

    async def __aenter__(self: _Q) -> _Q:
        """Open the queue (see :meth:`open`)."""
        return await self.open()

    async def aclose(self) -> None:
        """Stop consuming: wake waiting ``take``/``poll``/``receive`` calls with :class:`QueueClosedError`,
        hand items popped for departed callers back to the list, and stop the scheduler when this was
        its last user. Idempotent; returns within ``close_timeout_s`` seconds in every state (what
        could not be settled by then comes back through the hand-off lease).
        """
        if self._close_task is None:
            self._close_task = asyncio.get_running_loop().create_task(
                self._close(), name=f"aiodelayq-close:{self.name}")
        # Shielded: a caller cancelled while closing stops waiting, the close itself completes.
        await asyncio.shield(self._close_task)

    async def _close(self) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._close_timeout_s
        was_open = self._state == "open"
        self._state = "closing"
        try:
            opening = self._opening
            if opening is not None and not opening.done():
                opening.cancel()
                await asyncio.wait({opening}, timeout=max(0.0, deadline - loop.time()))
            if not was_open:
                return
            scheduler, pump, reliable = self._scheduler, self._pump, self._reliable
            if scheduler is not None and pump is not None and reliable is not None:
                for listener in (pump.notify, reliable.notify):
                    if listener in scheduler.listeners:
                        scheduler.listeners.remove(listener)
            if pump is not None:
                pump.fail_waiters(QueueClosedError(f"queue {self.name!r} was closed"))
                await pump.aclose(max(0.0, deadline - loop.time()) * 0.8)
            if reliable is not None:
                await reliable.aclose(loop.time() + max(0.0, deadline - loop.time()) * 0.5)
            await release_scheduler(self._client, self._keys, max(0.0, deadline - loop.time()))
        finally:
            self._state = "closed"

    # -- producing -------------------------------------------------------------------------------

    async def offer(self, item: T, delay: float | timedelta) -> int:
        """Add ``item``, due ``delay`` after now (seconds, or a ``timedelta``; rounded up to whole ms).

        "Now" is the Redis server's clock, so producers with skewed clocks still agree. Concurrent
        offers on one queue object share script calls: while one is in flight, the next carries
        every offer that arrived meanwhile (each still gets its own result or error). A call whose
        reply is lost is resent within ``call_timeout_s`` and applied once.

        Returns:
            The due time in epoch milliseconds (server clock).

        Raises:
            InvalidDelayError: negative, NaN, infinite or too large delay; nothing is written.
            EncodeError: the codec cannot encode ``item``; nothing is written.
            CallTimeoutError: no answer within ``call_timeout_s`` (see ``maybe_applied``).
            AccessDeniedError: the user may not write the queue's keys.
            BackendError: any other Redis failure (see ``maybe_applied``).
        """
        self._bind_loop()
        check_eviction_policy(self._client)
        return await self._producer.offer(item, delay)

    async def offer_many(self, items: Iterable[tuple[T, float | timedelta]]) -> list[int]:
        """Add many ``(item, delay)`` pairs in as few round trips as possible.

        Every item is validated and encoded first: one bad delay or item raises and writes nothing.
        The items travel in calls of at most 1,000 items and ``max_call_bytes`` bytes, each atomic
        and all sent at once; when more than one call is needed, a failure can leave earlier calls
        written.

        Returns:
            The due times in epoch milliseconds (server clock), in input order.

        Raises:
            InvalidDelayError, EncodeError, BackendError: as :meth:`offer`.
        """
        self._bind_loop()
        pairs = list(items)
        if not pairs:
            return []
        check_eviction_policy(self._client)
        return await self._producer.offer_many(pairs)

    # -- consuming -------------------------------------------------------------------------------

    def _require_open(self) -> TakePump:
        self._bind_loop()
        if self._state == "open" and self._pump is not None:
            return self._pump
        if self._state in ("closing", "closed"):
            raise QueueClosedError(f"queue {self.name!r} is closed")
        raise QueueNotOpenError(
            f"queue {self.name!r} is not open: use 'async with queue:' (or 'await queue.open()') to consume"
        )

    async def take(self) -> T:
        """Wait for the next due item and return it.

        Cancellation-safe: a caller that gives up (``asyncio.wait_for``, task cancel) never causes an
        item that Redis already popped to be lost; it goes to the next caller or back to the list.

        Raises:
            QueueNotOpenError: the queue is not open.
            QueueClosedError: the queue was closed while waiting.
            AccessDeniedError: the user may not pop from the queue.
        """
        return cast(T, (await self._require_open().get(None, 1))[0])

    async def take_many(self, max_items: int, timeout: float | None = None) -> list[T]:  # noqa: ASYNC109
        """Wait for at least one due item and return up to ``max_items`` of them in one round trip:
        the fast way to consume a busy queue.

        ``timeout`` bounds the wait in seconds (``None``: forever); ``[]`` when it passes.
        Cancellation-safe like :meth:`take`.

        Raises:
            QueueNotOpenError, QueueClosedError: as :meth:`take`.
            ConfigurationError: ``max_items`` < 1.
            InvalidDelayError: a negative/NaN timeout.
        """
        pump = self._require_open()
        if not isinstance(max_items, int) or isinstance(max_items, bool) or max_items < 1:
            raise ConfigurationError(f"max_items must be an int >= 1, got {max_items!r}")
        check_timeout(timeout)
        return cast(list[T], await pump.get(timeout, max_items))

    async def poll(self, timeout: float | None = None) -> T | None:  # noqa: ASYNC109 - public API
        """Return a due item, or ``None`` if none arrives within ``timeout`` seconds.

        ``timeout=None`` (or 0) does not wait: one pop attempt. Cancellation-safe like :meth:`take`.

        Raises:
            QueueNotOpenError, QueueClosedError: as :meth:`take`.
            InvalidDelayError: a negative or NaN timeout.
        """
        pump = self._require_open()
        check_timeout(timeout)
        items = await (pump.get(timeout, 1) if timeout else pump.get(None, 1, once=True))
        return cast(T, items[0]) if items else None

    def __aiter__(self) -> DelayedQueue[T]:
        """Iterate over due items forever; iteration ends when the queue is closed."""
        self._require_open()
        return self

    async def __anext__(self) -> T:
        """The next due item (:meth:`take`); ``StopAsyncIteration`` once the queue is closed."""
        try:
            return await self.take()
        except QueueClosedError:
            raise StopAsyncIteration from None

    # -- reliable consumption (at-least-once) ----------------------------------------------------------

    def _require_reliable(self) -> ReliableConsumer[T]:
        self._require_open()
        assert self._reliable is not None
        return self._reliable

    async def receive(self, visibility_timeout: float, timeout: float | None = None) -> Message[T] | None:  # noqa: ASYNC109
        """Wait for a due item and return it as a :class:`Message` that stays in flight until acked.

        Unlike :meth:`take`, nothing is lost when the consumer dies: a message not acked (or nacked)
        within ``visibility_timeout`` seconds is delivered again, with ``delivery_count`` + 1; past
        ``max_deliveries`` its payload goes to the dead-letter list. ``timeout`` bounds the wait
        (``None``: forever); ``None`` is returned when it passes.

        Raises:
            QueueNotOpenError, QueueClosedError: as :meth:`take`.
            InvalidDelayError: a bad ``visibility_timeout`` or ``timeout``.
            BackendError: the receive call failed.
        """
        messages = await self.receive_many(1, visibility_timeout, timeout)
        return messages[0] if messages else None

    async def receive_many(self, max_items: int, visibility_timeout: float,
                           timeout: float | None = None) -> list[Message[T]]:  # noqa: ASYNC109
        """Like :meth:`receive`, for up to ``max_items`` messages in one round trip; ``[]`` on timeout."""
        reliable = self._require_reliable()
        if not isinstance(max_items, int) or isinstance(max_items, bool) or max_items < 1:
            raise ConfigurationError(f"max_items must be an int >= 1, got {max_items!r}")
        check_timeout(timeout)
        return await reliable.receive_many(max_items, _visibility_ms(visibility_timeout), timeout)

    def messages(self, visibility_timeout: float) -> MessageIterator[T]:
        """``async for msg in queue.messages(30.0)``: :meth:`receive` until the queue is closed."""
        return MessageIterator(self._require_reliable(), _visibility_ms(visibility_timeout))

    # -- the pending side (Redisson RDelayedQueue semantics) ---------------------------------------

    async def size(self) -> int:
        """Number of pending (not yet due) elements: ``ZCARD`` of the timeout zset.

        (Redisson's ``size()`` is ``LLEN`` of the insertion-order list, which does not count fast
        elements.)
        """
        self._bind_loop()
        return await self._pending.size()

    async def ready_size(self) -> int:
        """Number of due items waiting in the destination list."""
        self._bind_loop()
        return await self._pending.ready_size()

    async def contains(self, item: T) -> bool:
        """Whether a pending element equals ``item`` (compared as encoded payload bytes).

        Walks the pending elements in due order, at most 1,000 (256 KiB) per script call, about a
        millisecond of server time each, until a match: a miss reads every page. Read-only; an
        element that moves or is added during the walk may or may not be seen.

        Raises:
            BackendError: a page call failed (each is bounded by ``call_timeout_s``, resends included).
        """
        self._bind_loop()
        return await self._pending.contains(item)

    async def read_all(self) -> list[T]:
        """All pending items in due order (the timeout zset's order: due time, then element bytes; fast
        elements due in the same millisecond come in their producer's insertion order). Malformed
        elements are skipped.

        Paged: one script call per 1,000 elements, so a large backlog never blocks the server. It is
        not a snapshot: an item that falls due, is removed or is added during the walk may or may not
        be in the list; none appears twice, and every item pending throughout the walk appears.

        Raises:
            DecodeError: a pending payload cannot be decoded by this queue's codec.
            BackendError: a page call failed (each is bounded by ``call_timeout_s``, resends included).
        """
        self._bind_loop()
        return cast(list[T], await self._pending.read_all())

    async def remove(self, item: T) -> bool:
        """Cancel one pending element equal to ``item``: the first found walking in due order (the one
        due soonest, among equal ones). ``True`` only if this call removed one.

        The walk is paged (like :meth:`contains`); the page that finds the match removes it in the
        same script call, so an element cannot be delivered and reported removed. A page whose reply
        was lost is resent with its call id and answers as its first run did. Removing an element
        that is in Redisson's list (Java-written, ``strict=True``, legacy) also ``LREM``s it from
        that list: O(length of the list), Redisson's own cost; fast elements cost O(log N).

        Raises:
            BackendError: a page call failed for good (bounded by ``call_timeout_s``, resends
                included); ``maybe_applied`` says whether it may have removed the element.
        """
        self._bind_loop()
        return bool(await self._pending.remove([item], first_only=True))

    async def remove_all(self, items: Iterable[T]) -> bool:
        """Cancel every pending element equal to any of ``items``; ``True`` if this call removed any.

        One paged walk for all of ``items`` (see :meth:`remove`, also for costs and resends). Not a
        snapshot: a match added during the walk may or may not be removed.
        """
        self._bind_loop()
        return bool(await self._pending.remove(items, first_only=False))

    async def clear(self) -> None:
        """Drop every pending element (both pending keys); the destination list is untouched."""
        self._bind_loop()
        await self._pending.clear()

    async def dead_letters(self) -> list[bytes]:
        """The raw entries of the dead-letter list: malformed pending elements as found, and
        payloads that could not be decoded or ran out of deliveries."""
        self._bind_loop()
        return await self._pending.dead_letters()


def _visibility_ms(visibility_timeout: float) -> int:
    vt_ms = delay_to_ms(visibility_timeout)
    if vt_ms < 1:
        raise InvalidDelayError("visibility_timeout must be at least 1 ms")
    return vt_ms
