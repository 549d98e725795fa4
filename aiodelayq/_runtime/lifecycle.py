"""The life of one queue object: its event loop, the open/close state machine, and what an open queue
owns (a share of the transfer task, the take pump, the reliable consumer) and counts.

Its background tasks have one owner, a :class:`~aiodelayq._util.tasks.TaskOwner`. States: ``new`` ->
``opening`` -> ``open`` -> ``closing`` -> ``closed``; a failed opening goes back to ``new``.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from .._consuming.reliable import ReliableConsumer
from .._consuming.take import TakePump
from .._options import QueueOptions
from .._recurring.refill import CronRefill
from .._redis.eviction import check_eviction_policy
from .._scripts import QueueScripts
from .._util.observe import Events
from .._util.tasks import TaskOwner, wait_through_cancellation
from .._wire.codec import batch_decoder
from ..exceptions import QueueClosedError, QueueNotOpenError, WrongEventLoopError
from .client_runtime import acquire_transfer_task, release_transfer_task
from .consumers import QueueConsumers
from .transfer_task import TransferTask

__all__ = ["Check", "Lifecycle", "QueueStats"]

log = logging.getLogger("aiodelayq")

# Of close_timeout_s, what is kept for cancelling the background tasks (a few loop turns, no server).
STOP_RESERVE_S = 0.1

State = Literal["new", "opening", "open", "closing", "closed"]


@dataclass(frozen=True)
class QueueStats:
    """Counters of one queue object in this process (its shared transfer task's included): a snapshot
    of the events the metrics sink gets.

    Attributes:
        transfers: transfer script runs by this process's transfer task for the queue.
        moved: items this process moved from pending to the destination list.
        dead_lettered: malformed pending elements moved to the dead-letter list.
        undecodable: popped payloads the codec could not decode (moved to the dead-letter list).
        expired: items found past their expiry (dead-lettered, reason ``"expired"``).
        transfer_errors: failed transfer attempts (retried with backoff).
        returned: popped items handed back to the list (caller gone, or prefetch unclaimed).
        recovered: popped items returned by this process's transfers after their hand-off lease.
        exhausted: messages dead-lettered past ``max_deliveries`` or not message elements.
        released: prefetched messages released unreceived (delivery count not raised).
        unconfirmed_settles: written-behind acks and releases that could not be confirmed (their
            messages are delivered again).
        offered: items written by this object's offer calls.
        delivered: items and messages handed to callers.
        pops: POP calls that returned items; empty_pops: those that found none and transferred
            nothing; pops_that_transferred: those that ran the transfer task's transfer first.
        receives: RECEIVE calls that returned messages; settle_calls: SETTLE calls.
    """

    transfers: int
    moved: int
    dead_lettered: int
    undecodable: int
    transfer_errors: int
    returned: int
    recovered: int = 0
    exhausted: int = 0
    released: int = 0
    unconfirmed_settles: int = 0
    offered: int = 0
    delivered: int = 0
    pops: int = 0
    empty_pops: int = 0
    pops_that_transferred: int = 0
    receives: int = 0
    settle_calls: int = 0
    expired: int = 0

    @classmethod
    def of(cls, own: Events, transfer_task: Events | None) -> QueueStats:
        """The stats of a queue object's events and its transfer task's (``None``: never opened)."""
        mine, shared = own.counts, transfer_task.counts if transfer_task is not None else Counter[str]()
        return cls(transfers=shared["transfers"], moved=shared["moved"],
                   dead_lettered=shared["dead_lettered:malformed"], undecodable=mine["undecodable"],
                   transfer_errors=shared["transfer_errors"], returned=mine["returned"],
                   recovered=shared["recovered"], exhausted=mine["exhausted"], released=mine["released"],
                   unconfirmed_settles=mine["unconfirmed_settles"], offered=mine["offered"],
                   delivered=mine["delivered"], pops=mine["pops"], empty_pops=mine["empty_pops"],
                   pops_that_transferred=mine["pops_that_transferred"], receives=mine["receives"],
                   settle_calls=mine["settle_calls"], expired=mine["dead_lettered:expired"])


class Check(Protocol):
    """A check run once before a queue object's first call to Redis (``_sharding/record.py``)."""

    @property
    def passed(self) -> bool: ...
    async def ensure(self) -> None: ...


class Lifecycle:
    """Binds a queue to its event loop, opens and closes its consumer side.
    ``rotation``: see :class:`TakePump`."""

    def __init__(self, scripts: QueueScripts, options: QueueOptions, events: Events, *,
                 on_new_loop: Callable[[], None], check: Check | None = None, rotation: int = 1) -> None:
        self._check = check
        self._rotation = rotation
        self._scripts = scripts
        self._events = events
        self._client = scripts.client
        self._keys = scripts.keys
        self._options = options
        self._on_new_loop = on_new_loop
        self._loop: asyncio.AbstractEventLoop | None = None
        self.state: State = "new"
        self._tasks = TaskOwner(f"queue {self._keys.destination!r}")
        self._refill = CronRefill(scripts, self._tasks)
        self._opening: asyncio.Task[None] | None = None
        self._openers = 0
        self._close_task: asyncio.Task[None] | None = None
        self._transfer_task: TransferTask | None = None
        self._pump: TakePump | None = None
        self._reliable: ReliableConsumer[Any] | None = None
        self._consumers: QueueConsumers | None = None

    def __repr__(self) -> str:
        return f"<Lifecycle {self._keys.destination!r} {self.state} openers={self._openers} tasks={len(self._tasks)}>"

    def bind_loop(self) -> None:
        """Bind to the running loop on first use (again once that loop is closed, if never opened).

        Raises:
            WrongEventLoopError: the queue belongs to another event loop.
        """
        loop = asyncio.get_running_loop()
        if self._loop is loop:
            return
        if self._loop is None or (self._loop.is_closed() and self.state == "new"):
            self._loop = loop
            self._on_new_loop()
            return
        raise WrongEventLoopError(
            f"queue {self._keys.destination!r} is bound to the event loop of its first use; it cannot be used "
            "from another one (create one DelayedQueue, and one redis client, per event loop)")

    async def enter(self) -> None:
        """What every call does first: :meth:`bind_loop`, then the check until it passes once.

        Raises:
            WrongEventLoopError: the queue belongs to another event loop. ShardCountError: the name
                has another shard count in Redis. BackendError: the check could not be made.
        """
        self.bind_loop()
        if self._check is not None and not self._check.passed:
            await self._check.ensure()

    def pump(self) -> TakePump:
        """The take pump of the open queue.

        Raises:
            QueueNotOpenError, QueueClosedError: the queue is not open.
        """
        if self._pump is not None and self._loop is asyncio.get_running_loop() and self.state == "open":
            return self._pump  # async for's hot path: once per item
        self.bind_loop()
        if self.state == "open" and self._pump is not None:
            return self._pump
        name = self._keys.destination
        if self.state in ("closing", "closed"):
            raise QueueClosedError(f"queue {name!r} is closed")
        raise QueueNotOpenError(f"queue {name!r} is not open: use 'async with queue:' (or 'await queue.open()') "
                                "to consume")

    def reliable(self) -> ReliableConsumer[Any]:
        """The reliable consumer of the open queue (raises as :meth:`pump`)."""
        self.pump()
        assert self._reliable is not None
        return self._reliable

    def stats(self) -> QueueStats:
        """A snapshot of the counters of this queue object's events (and of its transfer task's)."""
        transfer_task = self._transfer_task
        return QueueStats.of(self._events, transfer_task.events if transfer_task is not None else None)

    async def open(self) -> None:
        """Open once; concurrent openers share the opening task, which the last one to leave cancels
        (the queue owns it: :meth:`aclose` waits for it to end).

        Raises:
            QueueClosedError: closed (or closed while opening); the opening's own errors.
        """
        self.bind_loop()
        if self.state == "open":
            return
        name = self._keys.destination
        if self.state in ("closing", "closed"):
            raise QueueClosedError(f"queue {name!r} is {self.state}; create a new DelayedQueue")
        if self._opening is None:
            self.state = "opening"
            self._opening = self._tasks.spawn(self._open(), name=f"aiodelayq-open:{name}", quiet=True)
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
        if opening.cancelled() or self.state in ("closing", "closed"):
            raise QueueClosedError(f"queue {name!r} was closed while opening")
        opening.result()

    async def _open(self) -> None:
        o, keys = self._options, self._keys
        try:
            check_eviction_policy(self._client)
            if self._check is not None:
                await self._check.ensure()
            transfer_task = await acquire_transfer_task(
                self._client, keys, batch=o.transfer_batch, safety_poll_s=o.safety_poll_s,
                open_timeout_s=o.open_timeout_s, call_timeout_s=o.call_timeout_s, lag_warning_s=o.lag_warning_s)
        except BaseException:
            if self.state == "opening":
                self.state = "new"
            self._opening = None
            raise
        if self.state != "opening":  # aclose() ran while we were opening
            await release_transfer_task(self._client, keys, o.close_timeout_s)
            raise QueueClosedError(f"queue {keys.destination!r} was closed while opening")
        self._transfer_task = transfer_task
        self._pump = TakePump(self._scripts, self._tasks, decode=self._refill.decoder(o.resolved_codec),
                              decode_batch=batch_decoder(o.resolved_codec), slots=transfer_task.slots,
                              events=self._events, rotation=self._rotation)
        self._reliable = ReliableConsumer(self._scripts, self._tasks, o, self._events, self._refill)
        self._reliable.settler.on_room = transfer_task.room  # every consumer of the queue here looks
        self._consumers = QueueConsumers(self._pump, self._reliable)
        transfer_task.attach(self._consumers)
        self.state = "open"
        log.info("queue %r opened (subscribed, first transfer done)", keys.destination)

    async def aclose(self) -> None:
        """Close once, in a task of its own; a cancelled caller stops waiting, the close completes
        (within ``close_timeout_s``)."""
        if self._close_task is None:
            self._close_task = asyncio.get_running_loop().create_task(
                self._close(), name=f"aiodelayq-close:{self._keys.destination}")
        await asyncio.shield(self._close_task)

    async def _close(self) -> None:
        loop = asyncio.get_running_loop()
        started = loop.time()
        deadline = started + self._options.close_timeout_s
        was_open = self.state == "open"
        self.state = "closing"
        cancelled = False
        try:
            if was_open:
                cancelled = await self._settle(max(loop.time(), deadline - STOP_RESERVE_S))
            # Then whatever still runs is stopped: an opening, a settle cut off by the deadline. The
            # owner waits through a forced shutdown's cancellation, then raises it.
            try:
                await self._tasks.aclose(deadline)
            except asyncio.CancelledError:
                cancelled = True
            if was_open:
                await release_transfer_task(self._client, self._keys, max(0.0, deadline - loop.time()))
            if cancelled:
                raise asyncio.CancelledError
        finally:
            self.state = "closed"
            if was_open:
                log.info("queue %r closed in %.3f s", self._keys.destination, loop.time() - started)

    async def _settle(self, settle_by: float) -> bool:
        """The pump and the reliable consumer settle what they hold until ``settle_by`` (loop time),
        through a forced shutdown's cancellations; returns whether one arrived (the caller raises it)."""
        transfer_task, pump, reliable = self._transfer_task, self._pump, self._reliable
        if transfer_task is not None and self._consumers is not None:
            transfer_task.detach(self._consumers)
        loop = asyncio.get_running_loop()
        name = self._keys.destination
        settling: set[asyncio.Task[None]] = set()
        if pump is not None:
            pump.fail_waiters(QueueClosedError(f"queue {name!r} was closed"))
            settling.add(self._tasks.spawn(pump.aclose(settle_by - loop.time()), name=f"aiodelayq-close-take:{name}"))
        if reliable is not None:
            settling.add(self._tasks.spawn(reliable.aclose(settle_by), name=f"aiodelayq-close-reliable:{name}"))
        cancelled = await wait_through_cancellation(set(settling), max(0.0, settle_by - loop.time()))
        # A forced shutdown that reached one of them is raised too, once all is stopped.
        return cancelled or any(task.cancelled() for task in settling)
