"""The public :class:`DelayedQueue`: a facade. Options are checked by ``_options.py``; every call is
delegated to the part that fills its role (``_parts/roles.py``): offers to the producer, the pending
side to the contents, ``take``/``poll`` to the take pump and ``receive`` to the reliable consumer of
its lifecycle, which owns the queue's life. Those are one ordinary queue's parts
(``_parts/queue_parts.py``), or for ``shards > 1`` composites over the shards' (``_sharding/``). The
consuming calls are :class:`~aiodelayq._queue_consuming.ConsumingCalls`', the calls on what the queue
holds :class:`~aiodelayq._queue_contents.ContentsCalls`', the controls
:class:`~aiodelayq._queue_controls.ControlsCalls`'; this module has the rest."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from datetime import timedelta
from typing import Any, Literal, TypeVar, cast, overload

from anyio.abc import AsyncResource
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.backoff import AbstractBackoff

from ._consuming.worker_slots import Worker
from ._options import QueueOptions, WireFormat, WorkerOptions, check_client
from ._parts.queue_parts import QueueParts
from ._parts.roles import Parts
from ._producing.keyed import Offered, Pending
from ._queue_consuming import ConsumingCalls, items_of
from ._queue_contents import ContentsCalls
from ._queue_controls import ControlsCalls
from ._redis.cluster import is_cluster
from ._runtime.lifecycle import QueueStats
from ._sharding.layout import check_shards
from ._sharding.sharded import ShardedParts
from ._wire.codec import Codec
from ._wire.elements import ElementKind
from ._wire.key_names import QueueKeys
from .exceptions import ConfigurationError

__all__ = ["DelayedQueue"]

T = TypeVar("T")
_Q = TypeVar("_Q", bound="DelayedQueue[Any]")


class DelayedQueue(ConsumingCalls[T], ContentsCalls[T], ControlsCalls, AsyncResource):
    """A delayed queue on Redis that shares keys and element format with Redisson's ``RDelayedQueue``.

    Producers (``offer``/``offer_many``) and the pending-side calls work without opening the queue.
    Consumers open it (``async with queue:``), which starts this event loop's transfer task
    and pub/sub subscriber for the queue, then ``take``/``poll``/``async for`` or ``receive``.
    A queue object belongs to the event loop of its first call (:class:`WrongEventLoopError` from
    any other; a producer-only queue moves on once that loop is closed). A sharded queue object's
    first call (or its opening) checks that the shard count its name has in Redis is its ``shards``
    (its first user records the count); an ordinary one's offers and opening check that the name
    has none: :class:`ShardCountError` if not.

    Args:
        client: a ``redis.asyncio.Redis`` (a server, or ``Sentinel.master_for(...)``) or a
            ``redis.asyncio.RedisCluster``, with ``decode_responses=False`` (payloads are bytes).
        name: the destination list, Redisson's queue name; may contain a ``{hash tag}`` (unless
            sharded).
        codec: ``"json"`` (default), ``"str"``, ``"bytes"``, ``"msgpack"`` or an object with
            ``encode(obj) -> bytes`` and ``decode(bytes) -> obj``.
        wire_format: how this producer packs elements (see :data:`WireFormat`).
        strict: write strict elements (also in Redisson's insertion-order list, so Java's ``size()``,
            ``readAll()``, ``contains()``, ``remove()`` see them) instead of fast ones (zset only: no
            O(backlog) ``LREM`` when due). ``wire_format="redisson-legacy"`` writes legacy elements.
        max_deliveries: for :meth:`receive`: a message delivered this many times and still not acked
            goes to the dead-letter list instead of a further delivery (``None``: no limit).
        transfer_batch: most elements one transfer moves at a time (Redisson uses 100): a TRANSFER call,
            or a step of a consumer's POP while a backlog drains (more steps while the call is under 1.5 ms).
        safety_poll_s: seconds between transfers when nothing else wakes the transfer task.
        open_timeout_s: bound of ``open()`` (subscribe + first transfer), seconds; a server that
            refuses the connection fails it at once.
        close_timeout_s: bound of ``aclose()``, seconds.
        call_timeout_s: bound of every Redis call a method makes, resends included, seconds:
            :class:`CallTimeoutError`, whose ``maybe_applied`` says whether a write may have landed.
        max_call_bytes: most bytes of encoded items one offer call carries (a larger item goes alone);
            keep it under the server's ``proto-max-bulk-len``.
        min_replicas: durable writes: offers, ``cancel``/``reschedule``, requeued dead letters and a
            reliable consumer's receive and settle return only once this many replicas have them
            (``WAIT``), else raise :class:`NotReplicatedError` (0: no waiting, Redis's default).
        replication_timeout_s: how long a durable write waits for its replicas, seconds.
        wait_aof: durable writes also wait for the AOF fsync (``WAITAOF``: Redis/Valkey >= 7.2 with
            ``appendonly yes``) of the primary and of ``min_replicas`` replicas.
        capacity: the most items the queue may hold, pending + ready (``None``: no limit): an
            offer beyond it raises :class:`QueueFullError` and writes nothing, checked atomically
            by the offer script; an ``offer_many`` then goes in one call, all or nothing.
        max_item_bytes: the largest item (bytes) an offer or a schedule takes, as the queue stores it:
            the codec's bytes with the item's headers, expiry and envelope (``None``: no limit); a
            larger one raises :class:`ItemTooLargeError` before anything is written.
        lag_warning_s: the transfer watchdog of an open queue: a look (a transfer, the safety poll)
            that finds the earliest due item this many seconds late logs one WARNING, and one INFO
            once the lag is back under half of it (``None``: off). Like ``safety_poll_s``, the first
            queue object a client opens for a name sets it.
        tier_after_s: tiered pending, seconds, at least 1 (``None``: off): an item this object
            offers without a key, as a fast element, due so far ahead that the bucket of its due
            time starts more than this many seconds from now, waits in that bucket's compact list
            instead of the timeout zset (about half the memory at millions of pending items, and
            inserts that stay cheap). A bucket spans 60 s of due times (or this horizon, when
            shorter) and moves into the zset one width before its start, by the transfer of any
            aiodelayq queue object (with the option or not). Only aiodelayq's transfer does that: a queue consumed
            only by Redisson's transfer never delivers tiered items. Every call of the queue sees
            them (``size``, ``counts``, ``peek``, ``read_all``, ``contains``, ``remove``, ``clear``).
            Needs fast elements (not ``strict``, not legacy). See the docs' design, "Tiered pending".
        shards: how many shards the queue has (an ``int`` from 1 to 1,024; 1: an ordinary queue). A
            sharded queue is that many ordinary queues (:attr:`shard_names`) on evenly spaced cluster
            slots (with the default slot map and K a multiple of the primaries, K / primaries shards on
            each), so one queue can use every primary of a cluster: a keyed item goes to shard
            ``crc32(key) % K``, unkeyed ones in turn; consumers take from every shard. Due order holds
            within a shard only, ``offer_many`` is atomic per shard, ``capacity`` and a rate limit
            are split over the shards (docs: "Deployments: When to shard"). The count is fixed for the
            queue's life: the first user records it in Redis (with where the shards are, which every
            later object follows), and a sharded object with another count is refused with
            :class:`ShardCountError` at its first call (an ordinary one on a sharded name, by its
            offers and its opening).
            Allowed on a single server too (no gain there, K times the scheduling work).

    Raises:
        InvalidNameError: empty or non-``str`` name; on a ``RedisCluster``, a name whose keys do not all
            hash to one slot (a ``{`` that opens no hash tag: ``a{``, ``{}``, ``x{}y``; see
            :meth:`QueueKeys.check_one_slot`); a sharded queue's name with a brace.
        ConfigurationError: a bad option or a client that decodes responses.
    """

    def __init__(self, client: Redis | RedisCluster, name: str, *, codec: str | Codec = "json",
                 wire_format: WireFormat = "redisson", strict: bool = False, max_deliveries: int | None = None,
                 transfer_batch: int = 500,
                 safety_poll_s: float = 5.0, open_timeout_s: float = 10.0, close_timeout_s: float = 5.0,
                 call_timeout_s: float = 5.0, max_call_bytes: int = 1_000_000, min_replicas: int = 0,
                 replication_timeout_s: float = 1.0, wait_aof: bool = False, capacity: int | None = None,
                 max_item_bytes: int | None = None, lag_warning_s: float | None = 60.0,
                 tier_after_s: float | None = None, shards: int = 1) -> None:
        self._keys = keys = QueueKeys.for_name(name, cluster=is_cluster(client))
        self._client = check_client(client)
        self._options = o = QueueOptions.of(locals())
        self._shards = check_shards(shards, name)
        # One ordinary queue's parts, or composites over the shards' (_sharding/): the same roles.
        parts: Parts = (QueueParts.build(client, keys, o) if self._shards == 1
                        else ShardedParts.build(client, keys, o, self._shards))
        self._shard_keys = parts.shard_keys
        self._producer = parts.producer
        self._pending = parts.pending
        self._keyed = parts.keyed
        self._dead = parts.dead
        self._controls = parts.controls
        self._event_stream = parts.event_stream
        self._schedules = parts.schedules
        self._life = parts.life

    @property
    def name(self) -> str:
        """The queue name (the destination list key)."""
        return self._keys.destination

    @property
    def keys(self) -> QueueKeys:
        """The Redis keys of the queue.

        Raises:
            ConfigurationError: the queue is sharded: its items are in :attr:`shard_keys`, one
                :class:`QueueKeys` per shard.
        """
        if self._shards > 1:
            raise ConfigurationError(f"queue {self.name!r} has {self._shards} shards: its keys are shard_keys, "
                                     "one QueueKeys per shard")
        return self._keys

    @property
    def shards(self) -> int:
        """How many shards the queue has (1: an ordinary queue), fixed for the queue's life."""
        return self._shards

    @property
    def shard_keys(self) -> tuple[QueueKeys, ...]:
        """The keys of each shard, in shard order (an ordinary queue: its own keys alone). A sharded
        queue's :attr:`keys` are those of its name, which hold only its recorded shards. A name's
        shards take evenly spaced cluster slots (docs: "Deployments: When to shard"); a name that
        records shards placed by the hash of their names (``{name:0}`` ...) keeps them, which an
        object learns at its first call (or opening): until then it lists the spaced ones."""
        return self._shard_keys()

    @property
    def shard_names(self) -> tuple[str, ...]:
        """The queue name of each shard, in shard order (:attr:`shard_keys`' destinations; an ordinary
        queue: its own name alone): each shard is an ordinary Redisson queue of that name, which
        Java's ``RDelayedQueue`` can produce to and drain."""
        return tuple(keys.destination for keys in self._shard_keys())

    @property
    def wire_format(self) -> WireFormat:
        """How this producer packs elements."""
        return self._options.wire_format

    @property
    def strict(self) -> bool:
        """Whether this producer writes strict elements (the option as given; legacy elements, which
        ``wire_format="redisson-legacy"`` writes, also go in Redisson's list: see :attr:`element_kind`)."""
        return self._options.strict

    @property
    def element_kind(self) -> ElementKind:
        """The kind of element this producer writes: ``"fast"`` (the timeout zset only), ``"strict"``
        or ``"legacy"`` (also in Redisson's insertion-order list)."""
        return self._options.kind

    @property
    def tier_after_s(self) -> float | None:
        """The horizon of tiered pending, seconds (``None``: this object tiers nothing)."""
        ms = self._options.tier_after_ms
        return None if ms is None else ms / 1000

    @property
    def max_deliveries(self) -> int | None:
        """Deliveries a reliable message gets before it is dead-lettered (``None``: no limit)."""
        return self._options.max_deliveries

    @property
    def is_open(self) -> bool:
        """Whether ``take``/``poll``/``receive``/iteration can be used now."""
        return self._life.state == "open"

    @property
    def stats(self) -> QueueStats:
        """A snapshot of this process's counters for the queue."""
        return self._life.stats()

    def __repr__(self) -> str:
        shards = f" shards={self._shards}" if self._shards > 1 else ""
        return f"<DelayedQueue {self.name!r} {self._life.state} kind={self._options.kind}{shards}>"

    # -- lifecycle -------------------------------------------------------------------------------

    async def open(self: _Q) -> _Q:
        """Start consuming: subscribe, transfer once, arm the transfer task. A no-op when open; concurrent
        openers share one opening.

        Raises:
            BackendError: at once when the server refuses the connection (nothing listens at its
                address) or its setup (a database index it does not have), with its reason; else
                when Redis could not be reached within ``open_timeout_s``.
            AccessDeniedError: the user lacks a permission the queue needs (see the docs' ACL).
            QueueClosedError: the queue was closed (a queue is opened at most once).
            WrongEventLoopError: called from another event loop than the queue's.
        """
        await self._life.open()
        return self

    async def __aenter__(self: _Q) -> _Q:
        """Open the queue (see :meth:`open`)."""
        return await self.open()

    async def aclose(self) -> None:
        """Stop consuming: waiting ``take``/``poll``/``receive`` calls raise :class:`QueueClosedError`,
        popped items nobody took go back, the transfer task stops with its last user. Idempotent; returns
        within ``close_timeout_s`` seconds (the hand-off lease returns what is left then)."""
        await self._life.aclose()

    # -- producing -------------------------------------------------------------------------------

    @overload
    async def offer(self, item: T, delay: float | timedelta, *, headers: Mapping[str, str] | None = None,
                    expires: float | timedelta | None = None, group: str | None = None) -> int: ...
    @overload
    async def offer(self, item: T, delay: float | timedelta, *, key: str, replace: bool = False,
                    headers: Mapping[str, str] | None = None, expires: float | timedelta | None = None,
                    group: str | None = None, dedupe_for: float | timedelta | None = None) -> Offered: ...
    @overload
    async def offer(self, item: T, delay: float | timedelta, *, replace: bool = False,
                    headers: Mapping[str, str] | None = None, expires: float | timedelta | None = None,
                    group: str | None = None, dedupe_for: float | timedelta | None = None,
                    dedupe_by_content: Literal[True]) -> Offered: ...

    async def offer(self, item: T, delay: float | timedelta, *, key: str | None = None, replace: bool = False,
                    headers: Mapping[str, str] | None = None, expires: float | timedelta | None = None,
                    group: str | None = None, dedupe_for: float | timedelta | None = None,
                    dedupe_by_content: bool = False) -> int:
        """Add ``item``, due ``delay`` after now (seconds, or a ``timedelta``; rounded up to whole ms).

        "Now" is the Redis server's clock. Concurrent offers share script calls (each still gets its
        own result or error); a call whose reply is lost is resent within ``call_timeout_s`` and
        applied once.

        ``key`` (a ``str``, unique among pending items) makes the item addressable by
        :meth:`cancel`, :meth:`reschedule` and :meth:`get`. If an item with that key is pending,
        nothing changes (deduplication) unless ``replace=True``, which replaces its payload and due
        time. The key is free again once its item falls due, unless ``dedupe_for``.

        ``dedupe_for`` (seconds or a ``timedelta``, > 0; needs a key) keeps the key taken for that
        long after this call writes the item, whatever becomes of it (pending, delivered, acked,
        dead): another offer of the key in that window writes nothing (``replace=True`` still
        replaces the item while it is pending). ``dedupe_by_content=True`` (instead of ``key``)
        makes the key from the item: ``content:`` and the first 128 bits of SHA-256 of the encoded
        payload and headers. See the docs' "Keys" page.

        ``headers`` (``str`` keys and values, at most 16 KiB encoded) travel with the item to every
        consumer: :attr:`Message.headers`, :meth:`take_with_headers`, a worker's
        :func:`~aiodelayq.current_headers`, dead letters. ``expires`` (seconds or a ``timedelta``,
        > 0): an item not handed out within that long after its due time is not delivered; it goes
        to the dead-letter list with reason ``"expired"`` (the expiry is fixed here, on the server's
        clock: :meth:`reschedule` does not move it). An item with either is stored in an envelope
        that Redisson consumers see as part of its payload (see the docs' "Controls" page).

        ``group`` (a ``str``) puts the item in an ordered group ("Groups and limits" on the docs'
        "Controls" page): a group's items are handed out in due order, then offer order, and
        reliable consumers hold at most :meth:`set_group_concurrency` of them at once (1 by
        default: one at a time), while groups take turns. A grouped item waits in keys only
        aiodelayq's scripts move: Java consumers never see it. It combines with ``key``,
        ``headers`` and ``expires``.

        Returns:
            The due time in epoch milliseconds (server clock). With a key, an :class:`Offered` (an
            ``int``) whose ``added`` is ``False`` and ``deduplicated`` ``True`` when the key was
            taken, by a pending item or by a window (its value is then the due time of the item that
            took it), and ``replaced`` says whether a pending item was replaced.

        Raises:
            InvalidDelayError: negative, NaN, infinite or too large delay; nothing is written.
            InvalidKeyError: a key that is not a non-empty ``str`` of at most 1,024 UTF-8 bytes;
                ``dedupe_for`` without a key, or ``key`` with ``dedupe_by_content``; nothing is
                written. (InvalidDelayError for a ``dedupe_for`` that is not > 0.)
            InvalidGroupError: a group that is not a non-empty ``str`` of at most 256 UTF-8 bytes,
                or a group on a queue of strict or legacy elements; nothing is written.
            InvalidHeadersError: headers that are not ``str`` to ``str``, or over 16 KiB; nothing is
                written. (InvalidDelayError also for an ``expires`` that is not > 0.)
            EncodeError: the codec cannot encode ``item``; nothing is written.
            ItemTooLargeError: the item, with its headers and envelope, is over ``max_item_bytes``;
                nothing is written.
            QueueFullError: the queue holds ``capacity`` items (pending + ready); nothing is written.
            CallTimeoutError: no answer within ``call_timeout_s`` (see ``maybe_applied``).
            AccessDeniedError: the user may not write the queue's keys.
            BackendError: any other Redis failure (see ``maybe_applied``).
        """
        await self._life.enter()
        return await self._producer.offer(item, delay, key, replace, headers, expires, group, dedupe_for,
                                          dedupe_by_content)

    async def offer_many(self, items: Iterable[tuple[T, float | timedelta]], *,
                         keys: Iterable[str | None] | None = None, replace: bool = False,
                         headers: Sequence[Mapping[str, str] | None] | None = None,
                         expires: float | timedelta | Sequence[float | timedelta | None] | None = None,
                         groups: Sequence[str | None] | None = None, dedupe_for: float | timedelta | None = None,
                         dedupe_by_content: bool = False) -> list[int]:
        """Add many ``(item, delay)`` pairs in as few round trips as possible (calls of at most 1,000
        items, ``max_call_bytes`` and about 2 ms of server time, each atomic: the first alone, the
        others then at once, counting from its base, so items of one delay keep their order; a list
        of at most 50 items within ``max_call_bytes`` is one call); returns their due times (epoch
        ms, server clock) in input order. ``keys``: one key (or ``None``) per item, the rules of
        :meth:`offer`; then :class:`Offered` results. A key given twice: the first item is added,
        the second finds it pending (or replaces it). Every item is checked first (one bad one
        writes nothing); with more than one call, a failure can leave others written. Under
        ``capacity`` it is one call, all or nothing. ``headers``: one mapping (or ``None``) per
        item, parallel to ``keys``; ``expires``: one value for every item, or one (or ``None``) per
        item; ``groups``: one group (or ``None``) per item, parallel to ``keys``; ``dedupe_for``:
        one window for every keyed item (``keys`` or ``dedupe_by_content=True``). Raises as
        :meth:`offer`."""
        await self._life.enter()
        return await self._producer.offer_many(list(items), None if keys is None else list(keys), replace,
                                               headers, expires, None if groups is None else list(groups),
                                               dedupe_for, dedupe_by_content)

    # -- recurring items (see _recurring/schedules.py) --------------------------------------------------

    async def schedule(self, key: str, item: T, *, every: float | timedelta | None = None, cron: str | None = None,
                       tz: str | None = None, headers: Mapping[str, str] | None = None) -> int:
        """Deliver ``item`` again and again: every ``every`` (seconds or a ``timedelta``, the first
        one period from now), or at the times of the cron expression ``cron`` (5 fields, or 6 with
        seconds last, or a name such as ``@daily``; in UTC, or in the IANA time zone ``tz``; needs
        ``pip install 'aiodelayq[cron]'``, in consumers too). Returns the first due time (epoch ms,
        server clock).

        The schedule is ``key``'s: exactly one occurrence is pending at a time, a keyed pending item
        (:meth:`get` shows it, :meth:`cancel` stops the schedule). Handing an occurrence out
        (``take``, ``receive``, a worker) schedules the next one in the same atomic script call, so a
        crash can neither lose the chain nor double it. Occurrences missed while nothing consumed
        collapse into one, delivered late; the schedule then goes on with its first due time after
        now. Scheduling an existing key replaces its schedule and its pending item. ``headers``
        travel with every occurrence.

        Raises:
            ConfigurationError: neither or both of ``every`` and ``cron``, ``tz`` without ``cron``, a
                bad cron expression (another number of fields, or one that matches no date, such as
                ``0 0 30 2 *``) or time zone, croniter not installed; nothing is written.
            InvalidDelayError: an ``every`` that is not > 0. InvalidKeyError, InvalidHeadersError,
                EncodeError, ItemTooLargeError: as :meth:`offer`.
            BackendError: the call failed (``maybe_applied``).
        """
        await self._life.enter()
        return await self._schedules.schedule(key, item, every=every, cron=cron, tz=tz, headers=headers)

    # -- keyed pending items (see _producing/keyed.py) -----------------------------------------------------

    async def cancel(self, key: str) -> bool:
        """Remove the pending item offered with ``key``; ``True`` if there was one. O(log N) for the
        default (fast) elements; a strict or legacy element also leaves Redisson's list (O(N)). An
        item that already fell due (moved to the destination, or in flight) is not touched.

        Raises:
            InvalidKeyError: a bad key. BackendError: the call failed (``maybe_applied``).
        """
        await self._life.enter()
        return await self._keyed.cancel(key)

    async def reschedule(self, key: str, delay: float | timedelta) -> int | None:
        """Make the pending item of ``key`` due ``delay`` after now (server clock, as :meth:`offer`);
        returns the new due time (epoch ms), or ``None`` if no item with that key is pending.

        Raises:
            InvalidKeyError, InvalidDelayError: bad arguments. BackendError: the call failed.
        """
        await self._life.enter()
        return await self._keyed.reschedule(key, delay)

    async def get(self, key: str) -> Pending[T] | None:
        """The pending item of ``key`` (``.key``, ``.value``, ``.due_ms``), or ``None``. Read-only.

        Raises:
            InvalidKeyError: a bad key. DecodeError: its payload cannot be decoded.
            BackendError: the call failed.
        """
        await self._life.enter()
        return cast("Pending[T] | None", await self._keyed.get(key))

    # -- consuming: take, poll and receive are ConsumingCalls' (_queue_consuming.py) -------------

    def __aiter__(self) -> AsyncIterator[T]:
        """Iterate over due items (:meth:`take`) until the queue is closed. Raises as :meth:`take`."""
        return cast("AsyncIterator[T]", items_of(self._life.pump()))

    # -- a worker (see _consuming/worker_slots.py) -----------------------------------------------------------------

    def worker(self, handler: Callable[[T], Awaitable[object]], *, concurrency: int = 16,
               visibility_timeout_s: float = 30.0, reliable: bool = True, drain_timeout_s: float = 30.0,
               retry_backoff: AbstractBackoff | None = None) -> Worker[T]:
        """A :class:`Worker` of :meth:`consume`'s options (:class:`WorkerOptions`), to stop gracefully:
        ``await worker.run()`` until ``worker.stop()`` (running handlers get ``drain_timeout_s``
        seconds, then are cut off and their messages handed back) or ``worker.abort()`` (at once).
        Raises as :meth:`consume`."""
        return Worker(self, handler, WorkerOptions.of(locals()))

    async def consume(self, handler: Callable[[T], Awaitable[object]], *, concurrency: int = 16,
                      visibility_timeout_s: float = 30.0, reliable: bool = True, drain_timeout_s: float = 30.0,
                      retry_backoff: AbstractBackoff | None = None) -> None:
        """Run ``await handler(item)`` on every item as it falls due, at most ``concurrency`` at a
        time, until the queue is closed or this call is cancelled (then running handlers are cut off
        and their messages handed back, bounded); opens the queue if needed, and then closes it.

        The options are :class:`WorkerOptions`'s. Reliable (the default, at-least-once): each item is
        a :class:`Message` received with ``visibility_timeout_s`` seconds, kept alive while its
        handler runs longer (extended every third of it). Returned: acked. Raised :class:`Retry`:
        nacked for its delay. Raised :class:`Reject`: dead-lettered now. Raised anything else: logged and nacked after
        ``retry_backoff.compute(delivery_count)`` seconds (the count at most 64; a redis-py backoff; default
        ``EqualJitterBackoff(cap=300, base=1)``: 1-2 s, 2-4 s, 4-8 s...); past the queue's
        ``max_deliveries`` it is dead-lettered (set it: without a limit a failing item is retried
        forever). ``reliable=False``: plain ``take_many``, at most once; a failing handler's item is
        logged at ERROR and dropped. For a graceful stop (signals), use :meth:`worker`.

        ``handler`` is an async callable, whichever way a worker starts (this call, :meth:`worker`,
        ``Queues.add_worker``, ``Prioritized.worker``, ``run_worker``, ``aiodelayq worker``): an
        ``async def`` function or method, a ``functools.partial`` of one, an object with an
        ``async def __call__``, or a ``functools.wraps`` wrapper of one. Anything else (a plain
        function, a lambda) is refused before anything runs: run blocking code from an ``async
        def`` handler with ``await asyncio.to_thread(...)``.

        Raises:
            ConfigurationError: a bad option, named, or a handler that is not an async callable.
            BackendError: the queue could not be opened; AccessDeniedError: missing permissions.
        """
        worker = Worker(self, handler, WorkerOptions.of(locals()))
        if self.is_open:
            await worker.run()
            return
        async with self:
            await worker.run()

    # -- what the queue holds and its dead letters: ContentsCalls' (_queue_contents.py) ------------
    # -- its controls: ControlsCalls' (_queue_controls.py) ------------------------------------------
