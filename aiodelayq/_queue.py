"""The public :class:`DelayedQueue`."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
import os
import secrets
import struct
import time
import weakref
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Generic, Literal, TypeVar, cast

from anyio.abc import AsyncResource
from redis.asyncio import Redis
from redis.exceptions import RedisError

from ._batcher import OfferBatcher
from ._codec import Codec, decode_item, encode_item, resolve_codec
from ._consumer import TakePump
from ._keys import QueueKeys
from ._registry import acquire_scheduler, release_scheduler
from ._reliable import Message, MessageIterator, parse_message
from ._scheduler import TransferScheduler
from ._scripts import scripts_for
from ._tasks import shielded, within
from .exceptions import (
    BackendError,
    ConfigurationError,
    DecodeError,
    InvalidDelayError,
    QueueClosedError,
    QueueNotOpenError,
)

__all__ = ["DelayedQueue", "QueueStats", "WireFormat"]

log = logging.getLogger("aiodelayq")

T = TypeVar("T")
_Q = TypeVar("_Q", bound="DelayedQueue[Any]")

WireFormat = Literal["redisson", "redisson-legacy"]
"""How this producer packs pending elements: ``"redisson"`` (Redisson >= 3.21.1, ``Bc0Lc0``) or
``"redisson-legacy"`` (older Redisson, ``dLc0``). Reading always accepts both."""

# Scores are doubles: keep due times exact integers (2**53 ms is ~285,000 years).
MAX_DELAY_MS = 2**52

# Fast elements: 20-byte id = marker | insertion stamp | 8 random bytes (see _scripts.py).
_FAST_HEADER = b"\x14adq\x01"  # id length 20, then the marker
_OFFER_CHUNK = 1000
_FRAME = struct.Struct(">dI")  # delay ms, element length: one frame of the OFFER script's blob
_last_stamp = 0


def _next_stamps(count: int) -> int:
    """Reserve ``count`` insertion stamps (µs since the epoch, strictly increasing within this
    process); returns the first."""
    global _last_stamp
    first = max(_last_stamp + 1, time.time_ns() // 1000)
    _last_stamp = first + count - 1
    return first


@functools.lru_cache(maxsize=4)
def _long_struct(fmt: str) -> struct.Struct:
    return struct.Struct(fmt)


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
    """

    transfers: int
    moved: int
    dead_lettered: int
    undecodable: int
    transfer_errors: int
    returned: int


def delay_to_ms(delay: float | timedelta) -> int:
    """Convert a delay (seconds, or a ``timedelta``) to whole milliseconds, rounding up.

    Raises:
        InvalidDelayError: negative, NaN, infinite, too large, or not a number/``timedelta``.
    """
    if isinstance(delay, timedelta):
        seconds = delay.total_seconds()
    elif isinstance(delay, (int, float)) and not isinstance(delay, bool):
        seconds = float(delay)
    else:
        raise InvalidDelayError(f"delay must be seconds (int/float) or a timedelta, not {type(delay).__name__}")
    if math.isnan(seconds) or math.isinf(seconds):
        raise InvalidDelayError(f"delay must be finite, got {delay!r}")
    if seconds < 0:
        raise InvalidDelayError(f"delay must not be negative, got {delay!r}")
    # Round to the microsecond first so 0.1 s is 100 ms, then up so nothing is ever early.
    delay_ms = math.ceil(round(seconds * 1000.0, 3))
    if delay_ms > MAX_DELAY_MS:
        raise InvalidDelayError(f"delay {delay!r} is too large (max {MAX_DELAY_MS} ms)")
    return delay_ms


_long_formats: weakref.WeakKeyDictionary[Redis, str] = weakref.WeakKeyDictionary()
_long_format_asks: weakref.WeakKeyDictionary[Redis, asyncio.Future[str]] = weakref.WeakKeyDictionary()


async def _native_long_format(client: Redis) -> str:
    """``struct`` format of the server's native unsigned long (``L`` inside its Lua), asked once per
    client; concurrent first callers share one request (shielded: one caller's cancellation does
    not fail the others)."""
    fmt = _long_formats.get(client)
    if fmt is not None:
        return fmt
    ask = _long_format_asks.get(client)
    if ask is None or (ask.done() and (ask.cancelled() or ask.exception() is not None)):
        ask = _long_format_asks[client] = asyncio.ensure_future(_ask_native_long(client))
    return await asyncio.shield(ask)


async def _ask_native_long(client: Redis) -> str:
    one: bytes = await scripts_for(client).native_long(keys=[], args=[])
    fmt = _long_formats[client] = ("<" if one[0] == 1 else ">") + {4: "I", 8: "Q"}[len(one)]
    return fmt


def _check_timeout(timeout: float | None) -> None:
    if timeout is not None and (not isinstance(timeout, (int, float)) or isinstance(timeout, bool)
                                or math.isnan(timeout) or timeout < 0):
        raise InvalidDelayError(f"timeout must be None or seconds >= 0, got {timeout!r}")


@contextlib.contextmanager
def _backend(what: str) -> Iterator[None]:
    try:
        yield
    except (RedisError, OSError) as exc:
        raise BackendError(f"{what} failed: {exc}") from exc


class DelayedQueue(AsyncResource, Generic[T]):
    """A delayed queue on Redis that shares keys and element format with Redisson's ``RDelayedQueue``.

    Producers (``offer``/``offer_many``) and the pending-side calls work without opening the queue.
    Consumers open it (``async with queue:``), which starts this event loop's transfer scheduler
    and pub/sub subscriber for the queue, then ``take``/``poll``/``async for``.

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
        for label, value in (("safety_poll_s", safety_poll_s), ("open_timeout_s", open_timeout_s),
                             ("close_timeout_s", close_timeout_s)):
            if not isinstance(value, (int, float)) or not 0 < value < math.inf:
                raise ConfigurationError(f"{label} must be a positive number of seconds")
        try:
            self._codec = resolve_codec(codec)
        except (TypeError, ValueError) as exc:
            raise ConfigurationError(str(exc)) from exc
        self._client = client
        self._wire_format: WireFormat = wire_format
        self._kind = "legacy" if wire_format == "redisson-legacy" else ("current" if strict else "fast")
        self._batch = transfer_batch
        self._max_deliveries = max_deliveries or 0
        self._arrival = asyncio.Event()
        self._side_tasks: set[asyncio.Future[Any]] = set()
        self._safety_poll_s = float(safety_poll_s)
        self._open_timeout_s = float(open_timeout_s)
        self._close_timeout_s = float(close_timeout_s)
        self._scripts = scripts_for(client)
        self._state: Literal["new", "opening", "open", "closing", "closed"] = "new"
        self._scheduler: TransferScheduler | None = None
        self._pump: TakePump | None = None
        self._open_future: asyncio.Future[None] | None = None
        self._close_task: asyncio.Task[None] | None = None
        self._undecodable = 0
        self._batcher: OfferBatcher | None = None
        self._batcher_loop: asyncio.AbstractEventLoop | None = None

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
    def is_open(self) -> bool:
        """Whether ``take``/``poll``/iteration can be used now."""
        return self._state == "open"

    @property
    def stats(self) -> QueueStats:
        """A snapshot of this process's counters for the queue."""
        s = self._scheduler.stats if self._scheduler else None
        return QueueStats(
            transfers=s.transfers if s else 0,
            moved=s.moved if s else 0,
            dead_lettered=s.dead_lettered if s else 0,
            undecodable=self._undecodable,
            transfer_errors=s.errors if s else 0,
            returned=self._pump.returned if self._pump else 0,
        )

    def __repr__(self) -> str:
        return f"<DelayedQueue {self.name!r} {self._state}>"

    # -- lifecycle -------------------------------------------------------------------------------

    async def open(self: _Q) -> _Q:
        """Start consuming: subscribe, run the compensating transfer and arm the scheduler.

        Returns once the first transfer has succeeded. Opening an already open queue is a no-op.

        Raises:
            BackendError: Redis could not be reached within ``open_timeout_s``.
            QueueClosedError: the queue was closed (a queue is opened at most once).
        """
        if self._state == "open":
            return self
        if self._state == "opening" and self._open_future is not None:
            await asyncio.shield(self._open_future)
            return self
        if self._state != "new":
            raise QueueClosedError(f"queue {self.name!r} is {self._state}; create a new DelayedQueue")
        self._state = "opening"
        self._open_future = asyncio.get_running_loop().create_future()
        try:
            self._scheduler = await acquire_scheduler(
                self._client, self._keys, batch=self._batch, safety_poll_s=self._safety_poll_s,
                open_timeout_s=self._open_timeout_s)
            if self._state != "opening":  # aclose() ran while we were opening
                await release_scheduler(self._client, self._keys, self._close_timeout_s)
                raise QueueClosedError(f"queue {self.name!r} was closed while opening")
            self._pump = TakePump(self._client, self.name)
            self._scheduler.listeners.append(self._arrival.set)
            self._state = "open"
            self._open_future.set_result(None)
        except BaseException as exc:
            if self._state == "opening":
                self._state = "new"
            self._open_future.set_exception(exc)
            self._open_future.exception()  # retrieved: concurrent openers re-raise it themselves
            self._open_future = None
            raise
        return self

    async def __aenter__(self: _Q) -> _Q:
        """Open the queue (see :meth:`open`)."""
        return await self.open()

    async def aclose(self) -> None:
        """Stop consuming: wake waiting ``take``/``poll`` calls with :class:`QueueClosedError`, hand any
        item popped for a departed caller back to the list, and stop the scheduler when this was its
        last user. Idempotent; returns within about ``close_timeout_s`` seconds.
        """
        if self._close_task is None:
            was_open = self._state == "open"
            self._state = "closing"
            self._close_task = asyncio.get_running_loop().create_task(
                self._close(was_open), name=f"aiodelayq-close:{self.name}")
        # Shielded: a caller cancelled while closing stops waiting, the close itself completes.
        await asyncio.shield(self._close_task)

    async def _close(self, was_open: bool) -> None:
        try:
            if was_open:
                loop = asyncio.get_running_loop()
                deadline = loop.time() + self._close_timeout_s
                if self._scheduler is not None and self._arrival.set in self._scheduler.listeners:
                    self._scheduler.listeners.remove(self._arrival.set)
                self._arrival.set()  # waiting receivers see the closed state
                if self._pump is not None:
                    self._pump.fail_waiters(QueueClosedError(f"queue {self.name!r} was closed"))
                    await self._pump.aclose(self._close_timeout_s / 2)
                while self._side_tasks and loop.time() < deadline:
                    await asyncio.wait(set(self._side_tasks), timeout=max(0.01, deadline - loop.time()))
                await release_scheduler(self._client, self._keys, max(0.1, deadline - loop.time()))
        finally:
            self._state = "closed"

    # -- producing -------------------------------------------------------------------------------

    @property
    def strict(self) -> bool:
        """Whether this producer keeps its elements in Redisson's insertion-order list."""
        return self._kind != "fast"

    async def _prepare(self, pairs: list[tuple[T, float | timedelta]]) -> list[list[Any]]:
        """Validate, encode and (fast kind) pack every pair; raises before anything is sent.

        Returns one argument fragment per item whose first element is its delay in ms: fast
        ``[delay_ms, element]``, strict ``[delay_ms, id, payload]`` (packed by the script).
        """
        codec = self._codec
        if self._kind == "fast":
            # Packed here with the server's own 'L' layout, so the script only has to ZADD them.
            pack_len = _long_struct(await _native_long_format(self._client)).pack
            randomness = os.urandom(8 * len(pairs))  # one syscall for the whole batch
            first = _next_stamps(len(pairs))
            fragments = []
            for i, (item, delay) in enumerate(pairs):
                delay_ms = delay_to_ms(delay)
                payload = encode_item(codec, item)
                element = b"".join((_FAST_HEADER, (first + i).to_bytes(8, "big"), randomness[8 * i:8 * i + 8],
                                    pack_len(len(payload)), payload))
                fragments.append([delay_ms, element])
            return fragments
        if self._kind == "current":
            return [[delay_to_ms(d), os.urandom(8), encode_item(codec, item)] for item, d in pairs]
        return [[delay_to_ms(d), secrets.randbits(64) - 2**63, encode_item(codec, item)] for item, d in pairs]

    async def offer(self, item: T, delay: float | timedelta) -> int:
        """Add ``item``, due ``delay`` after now (seconds, or a ``timedelta``; rounded up to whole ms).

        "Now" is the Redis server's clock, so producers with skewed clocks still agree. Concurrent
        offers on one queue object share script calls: while one is in flight, the next carries
        every offer that arrived meanwhile (each still gets its own result or error).

        Returns:
            The due time in epoch milliseconds (server clock).

        Raises:
            InvalidDelayError: negative, NaN, infinite or too large delay; nothing is written.
            EncodeError: the codec cannot encode ``item``; nothing is written.
            BackendError: the Redis call failed.
        """
        with _backend("offer"):
            [fragment] = await self._prepare([(item, delay)])
        loop = asyncio.get_running_loop()
        if self._batcher is None or self._batcher_loop is not loop:
            self._batcher, self._batcher_loop = OfferBatcher(self._offer), loop
        return await self._batcher.submit(fragment)

    async def offer_many(self, items: Iterable[tuple[T, float | timedelta]]) -> list[int]:
        """Add many ``(item, delay)`` pairs in one round trip.

        Every item is validated and encoded first: one bad delay or item raises and writes nothing.
        Up to 1,000 items go in one atomic script call; a longer list is split into calls of 1,000
        (each atomic, all sent at once), so a Redis failure midway can leave earlier calls written.

        Returns:
            The due times in epoch milliseconds (server clock), in input order.

        Raises:
            InvalidDelayError, EncodeError, BackendError: as :meth:`offer`.
        """
        pairs = list(items)
        if not pairs:
            return []
        with _backend("offer_many"):
            fragments = await self._prepare(pairs)
        # Script calls of at most 1000 items keep each under a few ms of server time.
        if len(fragments) <= _OFFER_CHUNK:
            return await self._offer(fragments)
        chunks = [fragments[i:i + _OFFER_CHUNK] for i in range(0, len(fragments), _OFFER_CHUNK)]
        dues: list[int] = []
        for chunk_dues in await asyncio.gather(*(self._offer(chunk) for chunk in chunks)):
            dues.extend(chunk_dues)
        return dues

    async def _offer(self, fragments: list[list[Any]]) -> list[int]:
        k = self._keys
        keys = [k.destination, k.timeout_set, k.delay_list, k.channel]
        if self._kind == "fast":
            header = _FRAME.pack
            blob = b"".join(header(d, len(e)) + e for d, e in fragments)
            args: list[Any] = ["packed", blob, len(fragments)]
        else:
            args = [self._kind]
            for fragment in fragments:
                args.extend(fragment)
        with _backend("offer"):
            reply = await shielded(self._scripts.offer(keys=keys, args=args))
        if self._kind != "fast":
            return [int(d) for d in reply]
        now = int(reply[0])
        if len(reply) == 1:  # every element was new: due = now + delay
            return [now + int(fragment[0]) for fragment in fragments]
        return [int(d) for d in reply[1:]]

    # -- consuming -------------------------------------------------------------------------------

    def _require_open(self) -> TakePump:
        if self._state == "open" and self._pump is not None:
            return self._pump
        if self._state in ("closing", "closed"):
            raise QueueClosedError(f"queue {self.name!r} is closed")
        raise QueueNotOpenError(
            f"queue {self.name!r} is not open: use 'async with queue:' (or 'await queue.open()') to consume"
        )

    async def take(self) -> T:
        """Wait for the next due item and return it (``BLPOP`` on the destination list).

        Cancellation-safe: a caller that gives up (``asyncio.wait_for``, task cancel) never causes an
        item that Redis already popped to be lost; it goes to the next caller or back to the list.

        Raises:
            QueueNotOpenError: the queue is not open.
            QueueClosedError: the queue was closed while waiting.
        """
        return (await self._take(1, None))[0]

    async def take_many(self, max_items: int, timeout: float | None = None) -> list[T]:  # noqa: ASYNC109
        """Wait for at least one due item and return up to ``max_items`` of them in one round trip
        (``BLPOP`` then ``LPOP count``): the fast way to consume a busy queue.

        ``timeout`` bounds the wait in seconds (``None``: forever); ``[]`` when it passes.
        Cancellation-safe like :meth:`take`.

        Raises:
            QueueNotOpenError, QueueClosedError: as :meth:`take`.
            ValueError: ``max_items`` < 1 or a negative/NaN timeout.
        """
        if not isinstance(max_items, int) or max_items < 1:
            raise ConfigurationError(f"max_items must be an int >= 1, got {max_items!r}")
        _check_timeout(timeout)
        return await self._take(max_items, timeout)

    async def _take(self, max_items: int, timeout_s: float | None) -> list[T]:
        pump = self._require_open()
        loop = asyncio.get_running_loop()
        deadline = None if timeout_s is None else loop.time() + timeout_s
        while True:
            remaining = None if deadline is None else max(0.0, deadline - loop.time())
            raws = await pump.get(remaining, max_items)
            if not raws:
                return []
            items = self._decode_all(pump, raws)
            if items:
                return items

    async def poll(self, timeout: float | None = None) -> T | None:  # noqa: ASYNC109 - public API
        """Return a due item, or ``None`` if none arrives within ``timeout`` seconds.

        ``timeout=None`` (or 0) does not wait. Cancellation-safe like :meth:`take`.

        Raises:
            QueueNotOpenError, QueueClosedError: as :meth:`take`.
            InvalidDelayError: a negative or NaN timeout.
            BackendError: the non-waiting ``LPOP`` failed (waiting polls retry in the background).
        """
        pump = self._require_open()
        _check_timeout(timeout)
        if timeout:
            items = await self._take(1, timeout)
            return items[0] if items else None
        while True:
            with _backend("poll"):
                raws = await pump.pop_nowait()
            if not raws:
                return None
            items = self._decode_all(pump, raws)
            if items:
                return items[0]

    def _decode_all(self, pump: TakePump, raws: list[bytes]) -> list[T]:
        items: list[T] = []
        for raw in raws:
            try:
                items.append(cast(T, decode_item(self._codec, raw)))
            except DecodeError as exc:
                self._undecodable += 1
                log.error("aiodelayq: %s; moved to dead-letter list %r", exc, self._keys.dead_letter)
                pump.spawn(pump.write_with_retry(f"dead-letter an undecodable payload of {self.name!r}",
                                                 "RPUSH", self._keys.dead_letter, raw))
        return items

    # -- reliable consumption (at-least-once) ----------------------------------------------------------

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
        self._require_open()
        if not isinstance(max_items, int) or max_items < 1:
            raise ConfigurationError(f"max_items must be an int >= 1, got {max_items!r}")
        vt_ms = delay_to_ms(visibility_timeout)
        if vt_ms < 1:
            raise InvalidDelayError("visibility_timeout must be at least 1 ms")
        _check_timeout(timeout)
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while True:
            self._require_open()
            self._arrival.clear()
            messages, wait_s = await self._receive_once(max_items, vt_ms)
            if messages:
                return messages
            if deadline is not None:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    return []
                wait_s = min(wait_s, remaining)
            # Woken by this process's transfers, the earliest visibility deadline, or the 1 s re-check
            # (for items moved or nacked by other processes).
            await within(self._arrival.wait(), wait_s)

    def messages(self, visibility_timeout: float) -> MessageIterator[T]:
        """``async for msg in queue.messages(30.0)``: :meth:`receive` until the queue is closed."""
        self._require_open()
        return MessageIterator(self, visibility_timeout)

    async def _receive_once(self, max_items: int, vt_ms: int) -> tuple[list[Message[T]], float]:
        k = self._keys
        call = self._scripts.receive(keys=[k.destination, k.in_flight, k.dead_letter],
                                     args=[max_items, vt_ms, self._max_deliveries, os.urandom(16 * max_items)])
        # Run as an owned task: a caller cancelled meanwhile leaves it to finish, and what it
        # received is made visible again at once instead of waiting out the visibility timeout.
        task = asyncio.ensure_future(call)
        self._side_tasks.add(task)
        task.add_done_callback(self._side_tasks.discard)
        try:
            with _backend("receive"):
                reply = await asyncio.shield(task)
        except asyncio.CancelledError:
            task.add_done_callback(self._release_received)
            raise
        now_ms, head, dead = int(reply[0]), reply[1], int(reply[2])
        if dead:
            log.error("aiodelayq: %d message(s) of %r exceeded max_deliveries=%d; moved to dead-letter list %r",
                      dead, self.name, self._max_deliveries, k.dead_letter)
        wait_s = 1.0 if head is None else min(1.0, max(0.001, (float(head) - now_ms) / 1000))
        messages: list[Message[T]] = []
        for element in reply[3:]:
            message_id, count, due_ms, payload = parse_message(element)
            try:
                value = decode_item(self._codec, payload)
            except DecodeError as exc:
                self._undecodable += 1
                log.error("aiodelayq: %s; moved to dead-letter list %r", exc, k.dead_letter)
                try:
                    await self._settle(element, "dead")  # atomic: out of flight and into the list
                except BackendError as err:
                    log.warning("aiodelayq: could not dead-letter it now (%s); it stays in flight", err)
                continue
            messages.append(Message(cast(T, value), message_id, count, due_ms, self, element))
        return messages, wait_s

    def _release_received(self, task: asyncio.Future[Any]) -> None:
        if task.cancelled() or task.exception() is not None:
            return
        for element in task.result()[3:]:
            nack = asyncio.ensure_future(self._settle(element, "release"))
            self._side_tasks.add(nack)
            nack.add_done_callback(self._side_tasks.discard)

    async def _settle(self, element: bytes, mode: str) -> bool:
        k = self._keys
        with _backend(mode if mode in ("ack", "dead", "release") else "nack"):
            return bool(await shielded(self._scripts.settle(keys=[k.in_flight, k.dead_letter, k.destination],
                                                            args=[element, mode])))

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

    # -- the pending side (Redisson RDelayedQueue semantics) ---------------------------------------

    async def size(self) -> int:
        """Number of pending (not yet due) elements: ``ZCARD`` of the timeout zset.

        (Redisson's ``size()`` is ``LLEN`` of the insertion-order list, which does not count fast
        elements.)
        """
        with _backend("size"):
            return int(await shielded(self._client.zcard(self._keys.timeout_set)))

    async def ready_size(self) -> int:
        """Number of due items waiting in the destination list."""
        with _backend("ready_size"):
            return int(await shielded(self._client.llen(self._keys.destination)))

    async def contains(self, item: T) -> bool:
        """Whether a pending element equals ``item`` (compared as encoded payload bytes)."""
        payload = encode_item(self._codec, item)
        with _backend("contains"):
            return bool(await shielded(self._scripts.contains(keys=[self._keys.delay_list, self._keys.timeout_set],
                                                              args=[payload])))

    async def read_all(self) -> list[T]:
        """All pending items in insertion order: elements in Redisson's list first (list order), then fast
        elements by their producer's insertion stamp. Malformed elements are skipped.

        Raises:
            DecodeError: a pending payload cannot be decoded by this queue's codec.
        """
        with _backend("read_all"):
            payloads = await shielded(self._scripts.read_all(keys=[self._keys.delay_list, self._keys.timeout_set]))
        return [decode_item(self._codec, p) for p in payloads]

    async def remove(self, item: T) -> bool:
        """Cancel the first pending element (insertion order) equal to ``item``; ``True`` if one was."""
        payload = encode_item(self._codec, item)
        with _backend("remove"):
            n = await shielded(self._scripts.remove(keys=[self._keys.delay_list, self._keys.timeout_set],
                                                    args=["1", payload]))
        return bool(n)

    async def remove_all(self, items: Iterable[T]) -> bool:
        """Cancel every pending element equal to any of ``items``; ``True`` if any was."""
        payloads = [encode_item(self._codec, item) for item in items]
        if not payloads:
            return False
        with _backend("remove_all"):
            n = await shielded(self._scripts.remove(keys=[self._keys.delay_list, self._keys.timeout_set],
                                                    args=["0", *payloads]))
        return bool(n)

    async def clear(self) -> None:
        """Drop every pending element (both pending keys); the destination list is untouched."""
        with _backend("clear"):
            await shielded(self._client.delete(self._keys.delay_list, self._keys.timeout_set))

    async def dead_letters(self) -> list[bytes]:
        """The raw entries of the dead-letter list: malformed pending elements as found, and
        popped payloads the codec could not decode."""
        with _backend("dead_letters"):
            entries: list[bytes] = await shielded(cast(Any, self._client).lrange(self._keys.dead_letter, 0, -1))
        return entries
