"""A worker: runs a handler on a queue's items with bounded concurrency (:class:`Worker`, behind
``DelayedQueue.consume``), and what a handler raises to steer it (:class:`Retry`, :class:`Reject`).

One fetch task receives as many messages as there are free slots (one round trip for all of
them, prefetch aside) and starts a task per message; a lease keeper extends every message whose
handler has run for a third of the visibility timeout. Reliable mode (the default) acks on success
(as ``ack()`` does: written behind, or confirmed on a queue with durable writes, where the slot takes
its next message once the replicas have the ack) and nacks with a backoff on failure, so
``max_deliveries`` then dead-letters; a message whose handler was cut off by a shutdown is nacked
with no delay (it counts as a delivery: it did start, as BullMQ counts a stalled job). Plain mode
(``reliable=False``) takes items (``take_many_with_headers``): at most once, a failure is logged with
the item and the item is gone.

Stopping: :meth:`Worker.stop` stops fetching (a receive in flight is undone by the queue), lets
running handlers finish within ``drain_timeout_s``, then cancels the rest; :meth:`Worker.abort`
(a second Ctrl-C) cancels them at once. A handler still running after its cancellation gets it
again every ``_RECANCEL_EVERY_S``, for ``_RECANCEL_FOR_S``: a cancellation can be swallowed where it
lands (Python 3.11's ``asyncio.wait_for``, which redis-py sends its commands under, returns the
result of a command that completes as the cancellation arrives). Either way every started message
is settled or handed back, or, if Redis cannot be reached, comes back after its visibility timeout:
nothing is lost. Once the cut is over, the log says what became of each message whose handler was
running: how many were handed back (as many as ``stats.interrupted`` counts), which could not be
(by id), which handlers ended on their own (settled as usual) and which did not stop.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import inspect
import logging
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, Literal, Protocol, TypeVar

from redis.backoff import EqualJitterBackoff

from .._core.tasks import run_through_cancellation, wait_event
from .._core.tracing import process_span, tracer
from .._options import WorkerOptions
from .._redis.backoff import Backoff
from ..exceptions import (
    AccessDeniedError,
    BackendError,
    ConfigurationError,
    NotReplicatedError,
    QueueClosedError,
    WrongNodeError,
)
from .current import CURRENT_HEADERS, CURRENT_MESSAGE
from .messages import Message

if TYPE_CHECKING:
    from opentelemetry.trace import Tracer

__all__ = ["Reject", "Retry", "Worker", "WorkerStats", "check_handler"]

log = logging.getLogger("aiodelayq")

T = TypeVar("T")
State = Literal["new", "running", "draining", "stopped"]

# How long handing back an interrupted message may take (through a forced shutdown's
# cancellations); past it the message comes back after its visibility timeout anyway.
_HAND_BACK_BOUND_S = 1.0
# A cut-off handler that is still running gets its cancellation again this often, for at most this
# long after the cut (see the module docstring); one still running then is left running.
_RECANCEL_EVERY_S, _RECANCEL_FOR_S = 0.05, 0.5
# The longest a cut takes: the re-cancelling, then a hand-back begun at its end.
_CUT_BOUND_S = _RECANCEL_FOR_S + _HAND_BACK_BOUND_S + 0.2
# Longest a message fetched ahead waits for a free slot before it is released for other consumers.
_AHEAD_HOLD_S = 0.5
# While a fetch is in flight, a slot gives the loop a turn every this many messages.
_YIELD_EVERY = 8

BACKOFF_COUNT_CAP = 64
"""The largest delivery count a worker passes to its ``retry_backoff.compute``: an exponential
backoff is at its cap long before (2**64 times its base), and redis-py's own overflow (an
``OverflowError`` from about 2**1024) is never reached, however often a message comes back."""


def check_handler(handler: Callable[[T], Awaitable[object]], what: str = "handler"
                  ) -> Callable[[T], Awaitable[object]]:
    """``handler``, if it is an async callable: an ``async def`` function or method, a
    ``functools.partial`` of one, an object whose class has an ``async def __call__``, a function
    marked with ``inspect.markcoroutinefunction`` (Python 3.12+), or a ``functools.wraps`` wrapper
    of one of these. The one rule of every way a worker starts, checked where it is made: a
    worker awaits what its handler returns, and a plain function's ``None`` would fail every item.

    Raises:
        ConfigurationError: anything else (a plain function or lambda, a class, a non-callable),
            naming ``what``.
    """
    if not _is_async_callable(handler):
        raise ConfigurationError(
            f"{what} must be an async callable taking one item ('async def', a functools.partial of one, or an "
            f"object with 'async def __call__'), not {handler!r}: a worker awaits what it returns. For a lambda "
            "that returns a coroutine, use functools.partial; run blocking code from an 'async def' with "
            "'await asyncio.to_thread(work, item)'")
    return handler


def _is_async_callable(obj: object, depth: int = 0) -> bool:
    if not callable(obj) or depth > 10:
        return False
    if inspect.iscoroutinefunction(obj):  # functions, methods, partials of them, marked functions
        return True
    if isinstance(obj, functools.partial):
        return _is_async_callable(obj.func, depth + 1)
    if not isinstance(obj, type) and inspect.iscoroutinefunction(type(obj).__call__):
        return True  # an instance whose class has 'async def __call__'
    wrapped = getattr(obj, "__wrapped__", None)
    return wrapped is not None and _is_async_callable(wrapped, depth + 1)


class Retry(Exception):
    """Raised by a handler: deliver the message again after ``delay_s`` seconds (``None``: the
    worker's backoff). It counts as a delivery, so ``max_deliveries`` still applies."""

    def __init__(self, delay_s: float | None = None) -> None:
        super().__init__(f"retry in {delay_s} s" if delay_s is not None else "retry")
        self.delay_s = delay_s


class Reject(Exception):
    """Raised by a handler: no retry can fix this item; dead-letter it now (reason ``"nacked"``)."""


@dataclass
class WorkerStats:
    """What a worker did so far.

    Attributes:
        started: handlers started. succeeded: handlers that returned. failed: handlers that raised
            (:class:`Retry` and :class:`Reject` included). retried: messages nacked for a retry.
        rejected: messages dead-lettered by :class:`Reject`. interrupted: handlers ended by a stop's
            cancellation: their messages are handed back (nacked with no delay, or dead-lettered
            when that was their last delivery), or, when that fails, come back after their
            visibility timeout (the log names them). A handler that ends on its own as it is cut
            off (it returns or raises something else) counts as succeeded or failed instead.
            lost_leases: messages whose visibility timeout ran out while their handler ran (they
            may be delivered twice).
    """

    started: int = 0
    succeeded: int = 0
    failed: int = 0
    retried: int = 0
    rejected: int = 0
    interrupted: int = 0
    lost_leases: int = 0


class Source(Protocol[T]):
    """What a worker needs of a queue (a :class:`DelayedQueue`)."""

    @property
    def name(self) -> str: ...
    @property
    def max_deliveries(self) -> int | None: ...
    @property
    def is_open(self) -> bool: ...
    async def receive_many(self, max_items: int, visibility_timeout: float,
                           timeout: float | None = None) -> list[Message[T]]: ...
    async def take_many_with_headers(self, max_items: int, timeout: float | None = None
                                     ) -> list[tuple[T, dict[str, str]]]: ...


class Worker(Generic[T]):
    """Runs ``handler(item)`` on a queue's items, at most ``concurrency`` at a time (see the module
    docstring and :meth:`DelayedQueue.consume`). :meth:`run` returns once stopped.

    Raises:
        ConfigurationError: ``handler`` is not an async callable (:func:`check_handler`).
    """

    def __init__(self, queue: Source[T], handler: Callable[[T], Awaitable[object]], options: WorkerOptions) -> None:
        self.queue, self.handler, self.options = queue, check_handler(handler), options
        self.concurrency, self.reliable = concurrency, reliable = options.concurrency, options.reliable
        self.visibility_timeout_s = options.visibility_timeout_s
        self.drain_timeout_s = options.drain_timeout_s
        self.retry_backoff = options.retry_backoff or EqualJitterBackoff(cap=300.0, base=1.0)
        self.stats = WorkerStats()
        self.state: State = "new"
        # `concurrency` slot tasks take fetched entries from `_ahead` one after the other; `_busy`
        # maps a slot to the message it works on. A slot whose handler does not suspend goes on
        # to the next entry at once: no task per message, no loop turn between them.
        self._slots: set[asyncio.Task[None]] = set()
        self._busy: dict[asyncio.Task[None], Message[T] | None] = {}
        self._ahead: collections.deque[Any] = collections.deque()
        # Reliable mode fetches up to `_ahead_max` messages beyond the free slots, and the next
        # fetch goes out while slots work through them: without it every slot waits a round trip
        # per message, and the worker falls far behind `async for` (the drain benchmark). Dropped to
        # 0 when one waited `_hold_s` (those are released, uncounted, for other consumers: slow
        # handlers do not hoard work, nor let messages age ahead); doubled back up to the cap each
        # time a slot finds none waiting.
        self._ahead_cap = max(concurrency, 128) if reliable else 0
        self._ahead_max = self._ahead_cap
        self._low_water = max(1, self._ahead_max)  # fewer entries waiting: fetch more
        self._idle: collections.deque[asyncio.Future[None]] = collections.deque()  # parked slots
        self._need = asyncio.Event()
        self._fetching = False  # a fetch is in flight
        self._cutting = False  # the slots are being cancelled by this worker
        # Slots that are settling a message after its handler ended (handing it back after a cut,
        # or nacking a failure): a cut does not cancel them again. A cut-off slot records what
        # became of its message in `_handed_back` (None: handed back; else why not).
        self._settling: set[asyncio.Task[None]] = set()
        self._handed_back: dict[asyncio.Task[None], str | None] = {}
        self._extending: dict[str, asyncio.Task[bool]] = {}  # message id -> its extend in flight
        # Longest a message fetched ahead waits for a slot before it is released.
        self._hold_s = min(_AHEAD_HOLD_S, self.visibility_timeout_s / 4)
        self._waking = 0  # slots woken that have not run yet  # the fetcher should look at `want` again
        self._stopping = asyncio.Event()
        self._abort = asyncio.Event()
        self._closed_is_error = False  # set by run(): the queue was not open when it began

    def __repr__(self) -> str:
        return (f"<Worker {self.queue.name!r} {self.state} running={len(self._busy)}/{self.concurrency} "
                f"ahead={len(self._ahead)} reliable={self.reliable} started={self.stats.started}>")

    @property
    def running(self) -> int:
        """Handlers running now."""
        return len(self._busy)

    def stop(self) -> None:
        """Graceful: fetch no more, let running handlers finish within ``drain_timeout_s``."""
        self._stopping.set()
        self._wake(-1)  # idle slots end

    def abort(self) -> None:
        """Stop now: cancel running handlers and hand their messages back."""
        self._abort.set()
        self.stop()

    async def run(self) -> None:
        """Fetch and handle until :meth:`stop`/:meth:`abort` or the queue is closed, then drain.
        If the caller is cancelled, handlers are cancelled and their messages handed back (bounded),
        then the cancellation propagates.

        Raises:
            ConfigurationError: the worker already ran. QueueNotOpenError: the queue is not open.
            QueueClosedError: the queue was closed before the call (a queue closed while the
                worker runs ends it, drained, without an error).
            AccessDeniedError, WrongNodeError: permanent errors of the queue's calls.
        """
        if self.state != "new":
            raise ConfigurationError("a Worker runs once: create a new one")
        # A queue closed before the run is an error, as for take(): a supervisor that restarts the
        # worker must not read it as a clean exit. One that closes while the worker runs ends it.
        self._closed_is_error = not self.queue.is_open
        self.state = "running"
        loop = asyncio.get_running_loop()
        name = self.queue.name
        fetcher = loop.create_task(self._fetch_loop(), name=f"aiodelayq-worker-fetch:{name}")
        keeper = (loop.create_task(self._keep_leases(), name=f"aiodelayq-worker-leases:{name}")
                  if self.reliable else None)
        self._slots = {loop.create_task(self._slot(), name=f"aiodelayq-worker-slot:{name}")
                       for _ in range(self.concurrency)}
        try:
            stop = loop.create_task(self._stopping.wait())
            try:
                await asyncio.wait({fetcher, stop}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                stop.cancel()
            self.state = "draining"
            self.stop()
            fetcher.cancel()  # a receive in flight is undone by the queue (cancellation-safe)
            await asyncio.wait({fetcher})
            await self._release_ahead()
            await self._drain()
        except asyncio.CancelledError:
            self.abort()
            fetcher.cancel()

            async def hand_back() -> None:
                await asyncio.wait({fetcher})
                await asyncio.gather(self._release_ahead(), self._cancel_slots())

            await run_through_cancellation(hand_back, _CUT_BOUND_S + 0.3)
            if fetcher.done() and not fetcher.cancelled() and fetcher.exception() is not None:
                log.error("worker on %r: fetching failed", name, exc_info=fetcher.exception())
            raise
        finally:
            try:
                if keeper is not None:
                    keeper.cancel()
                    await asyncio.wait({keeper})
            finally:
                self.state = "stopped"
        if not fetcher.cancelled() and fetcher.exception() is not None:
            raise fetcher.exception()  # type: ignore[misc]

    async def _drain(self) -> None:
        """Wait for the slots to finish their handlers until ``drain_timeout_s`` passes or
        :meth:`abort`; cancel the rest (their messages are handed back)."""
        loop = asyncio.get_running_loop()
        if self._busy and not self._abort.is_set():
            log.info("worker on %r draining %d running handler(s), up to %.1f s",
                     self.queue.name, len(self._busy), self.drain_timeout_s)
        deadline = loop.time() + self.drain_timeout_s
        abort = loop.create_task(self._abort.wait())
        try:
            while not self._abort.is_set() and loop.time() < deadline and not all(t.done() for t in self._slots):
                await asyncio.wait({*self._slots, abort}, timeout=deadline - loop.time(),
                                   return_when=asyncio.FIRST_COMPLETED)
        finally:
            abort.cancel()
        await self._cancel_slots()

    async def _cancel_slots(self) -> None:
        """Cancel every slot and wait for them: a cut-off handler hands its message back within
        _HAND_BACK_BOUND_S; one still running gets its cancellation again every _RECANCEL_EVERY_S
        for _RECANCEL_FOR_S, and is left running after that (its message comes back after its
        visibility timeout). Then logs what became of the messages of the handlers that ran."""
        self._cutting = True
        cut = dict(self._busy)  # the handlers running now, and their messages
        if not self._slots:
            return
        loop = asyncio.get_running_loop()
        start = loop.time()
        while True:
            running = {task for task in self._slots if not task.done() and task not in self._settling}
            if not running or loop.time() - start >= _RECANCEL_FOR_S:
                break
            for task in running:
                task.cancel()
            await asyncio.wait(running, timeout=min(_RECANCEL_EVERY_S, start + _RECANCEL_FOR_S - loop.time()))
        pending = {task for task in self._slots if not task.done()}
        if pending:
            await asyncio.wait(pending, timeout=max(0.0, start + _CUT_BOUND_S - loop.time()))
        # Slots still settling what their handler ended with (Redis slow to answer): the settle goes
        # on behind (the settler's call is not cut off with its waiter), the slot stops now.
        late = {task for task in self._slots
                if not task.done() and task in self._settling and task not in self._handed_back}
        for task in late:
            task.cancel()
        if late:
            await asyncio.wait(late, timeout=0.1)
        for task in self._slots:
            if task.done() and not task.cancelled() and task.exception() is not None:  # a bug here, not in a handler
                log.error("worker slot failed", exc_info=task.exception())
        self._report_cut(cut)

    def _report_cut(self, cut: dict[asyncio.Task[None], Message[T] | None]) -> None:
        """Log what became of the messages of the handlers running when the cut began (``cut``):
        handed back (INFO; with those not handed back, as many as ``stats.interrupted`` counted),
        not handed back (WARNING, by id), ended on their own (INFO) and left running (ERROR)."""
        name = self.queue.name
        handed_back = dead = 0
        not_back: list[str] = []
        ended: list[str] = []
        stuck: list[str] = []
        for slot, message in cut.items():
            if slot in self._handed_back:  # ended by the cut's cancellation: counted in stats.interrupted
                why = self._handed_back.pop(slot)
                if message is None:
                    continue  # plain mode: its item was logged at ERROR
                if why is not None:
                    not_back.append(f"{message.id} ({why})")
                elif _is_last(message):
                    dead += 1  # its last delivery: the nack dead-lettered it (reason max_deliveries)
                else:
                    handed_back += 1
            elif not slot.done():
                stuck.append(message.id if message is not None else "an item")
            elif message is not None:
                ended.append(message.id)
        self._handed_back.clear()
        cut_off = handed_back + dead + len(not_back)
        if cut_off:
            more = "".join((f", {dead} dead-lettered (it was their last delivery)" if dead else "",
                            f", {len(not_back)} could not be" if not_back else ""))
            log.info("worker on %r cut off %d handler(s): %d message(s) handed back (due again now)%s",
                     name, cut_off, handed_back, more)
        if not_back:
            log.warning("worker on %r could not hand back %d message(s) of cut-off handlers; they come "
                        "back after their visibility timeout: %s", name, len(not_back), ", ".join(not_back))
        if ended:
            log.info("worker on %r: %d handler(s) ended on their own as they were cut off (their messages "
                     "are settled as usual: acked, or nacked as failures): %s", name, len(ended), ", ".join(ended))
        if stuck:
            log.error("worker on %r: %d handler(s) did not stop when cancelled; left running (a message "
                      "comes back after its visibility timeout unless its handler finishes): %s",
                      name, len(stuck), ", ".join(stuck))

    async def _slot(self) -> None:
        """Take entries and handle them, one at a time, until stopping (plain mode first finishes
        the items already taken for it: they cannot be handed back)."""
        me = asyncio.current_task()
        assert me is not None
        loop = asyncio.get_running_loop()
        ahead, busy, stats, reliable, handler = self._ahead, self._busy, self.stats, self.reliable, self.handler
        since_yield = 0
        while True:
            if self._stopping.is_set() and (reliable or not ahead):
                return
            if not ahead:
                if self._ahead_max < self._ahead_cap:
                    self._ahead_max = min(self._ahead_cap, max(1, self._ahead_max * 2))  # found nothing waiting
                self._need.set()
                # Park until woken for an entry (one slot per entry fetched, not all of them).
                parked = loop.create_future()
                self._idle.append(parked)
                await parked
                self._waking -= 1
                continue
            # Every await of this loop comes before an entry is taken: a slot cancelled there
            # holds nothing (an entry taken is in `busy` until it is settled or handed back).
            yielded = False
            if len(ahead) < self._low_water and not self._need.is_set():
                # Running low: let the fetcher send its next call now, so its reply travels while
                # this slot works through what is left.
                self._need.set()
                yielded = True
            elif self._fetching and since_yield >= _YIELD_EVERY:
                # A handler that never suspends would run this loop to the end of the deque
                # before the fetch's reply is read: give the loop a turn now and then meanwhile.
                yielded = True
            if yielded:
                since_yield = 0
                await asyncio.sleep(0)
                if not ahead or self._stopping.is_set():
                    continue  # (another slot took the rest, or a stop came)
            entry = ahead.popleft()
            since_yield += 1
            if ahead and self._idle and not self._waking:
                # More is waiting: wake one more slot. It runs when this one's handler suspends
                # and wakes the next in turn, so slow handlers fill every slot, while a handler
                # that never suspends drains the deque alone without 15 slots waking for nothing.
                self._wake(1)
            if reliable:
                message, item = entry, entry.value
                CURRENT_MESSAGE.set(message)
            else:  # an (item, headers) pair
                message, (item, headers) = None, entry
                CURRENT_HEADERS.set(headers)
            busy[me] = message
            stats.started += 1
            # The handler runs here, not in a helper coroutine: every layer per message costs, and
            # a no-op handler's worker is held against a plain `async for` (the drain benchmark).
            # Traced only while an OpenTelemetry SDK is set up (a CONSUMER span around the call).
            found = tracer()
            try:
                if found is None:
                    await handler(item)
                else:
                    await self._traced(found, item, message, headers if message is None else message.headers)
            except asyncio.CancelledError as exc:
                if self._cut_off(me):
                    await self._interrupted(item, message)
                    raise
                # Not this worker's doing: the handler awaited something that was cancelled.
                stats.failed += 1
                await self._settling_in(me, self._failed(item, message, exc))
            except Exception as exc:  # the handler's failure: settle it, never let it kill the worker
                stats.failed += 1
                await self._settling_in(me, self._failed(item, message, exc))
            else:
                stats.succeeded += 1
                # Written behind, or confirmed (durable writes, or near its deadline): then the slot
                # waits, and the acks of the slots that wait meanwhile share the next SETTLE call.
                if message is not None and not message._ack_behind():
                    await self._settling_in(me, self._settle(message, "ack", 0.0))
            finally:
                del busy[me]

    async def _traced(self, found: Tracer, item: T, message: Message[T] | None, headers: dict[str, str]) -> None:
        """The handler's call inside a ``process`` span, the child of the item's producer context."""
        with process_span(found, self.queue.name, headers, None if message is None else message.id,
                          None if message is None else message.delivery_count):
            await self.handler(item)

    async def _settling_in(self, slot: asyncio.Task[None], settling: Awaitable[object]) -> None:
        """Await ``settling``, the settle of ``slot``'s message after its handler ended: a cut does
        not cancel the slot meanwhile (it ends once this is done)."""
        self._settling.add(slot)
        try:
            await settling
        finally:
            self._settling.discard(slot)

    def _cut_off(self, slot: asyncio.Task[None]) -> bool:
        """Whether a ``CancelledError`` in ``slot`` is a stop's (or the caller's, or a forced
        shutdown's), as opposed to one a handler ran into on its own."""
        cancelling = getattr(slot, "cancelling", None)  # Python >= 3.11 counts requests
        if cancelling is not None:
            return bool(cancelling())
        return self._cutting or self._abort.is_set()

    def _wake(self, count: int) -> None:
        """Wake up to ``count`` parked slots (every one with ``count`` < 0)."""
        idle = self._idle
        while idle and count != 0:
            parked = idle.popleft()
            if not parked.done():
                parked.set_result(None)
                self._waking += 1
                count -= 1

    async def _fetch_loop(self) -> None:
        backoff = Backoff(f"fetch of the worker on {self.queue.name!r}")
        while True:
            if self.reliable and self._ahead and self._waited_s(self._ahead[0]) >= self._hold_s:
                # A message fetched ahead waited its limit for a slot: handlers are slower than
                # the fetches. Give those that waited back for other consumers (before their
                # visibility timeout runs low), and fetch none ahead until a slot finds nothing
                # waiting (then 1, 2, 4...).
                self._ahead_max = 0
                await self._release_ahead(only_waited=True)
            want = self.concurrency + self._ahead_max - len(self._busy) - len(self._ahead)
            # While messages wait, every wait is short, so the check above runs in time.
            check_s = self._hold_s / 2 if self._ahead else None
            if want <= 0 or len(self._ahead) >= self._low_water:
                self._need.clear()
                await wait_event(self._need, check_s)
                continue
            try:
                self._fetching = True
                try:
                    if self.reliable:
                        fetched: list[Any] = await self.queue.receive_many(want, self.visibility_timeout_s, check_s)
                    else:
                        fetched = await self.queue.take_many_with_headers(want)
                finally:
                    self._fetching = False
                self._ahead.extend(fetched)
            except QueueClosedError:
                if self._closed_is_error:
                    raise
                return
            except BackendError as exc:
                if isinstance(exc, (AccessDeniedError, WrongNodeError)):
                    raise  # permanent: no retry can fix a missing permission or a wrong node
                await asyncio.sleep(backoff.failed(exc))
                continue
            backoff.succeeded()
            if fetched and not self._waking:
                self._wake(1)

    def _waited_s(self, message: Message[T]) -> float:
        """How long ``message`` has been held since it was received (or last extended), seconds."""
        return self.visibility_timeout_s - message.remaining_s

    async def _release_ahead(self, *, only_waited: bool = False) -> None:
        """Hand back messages fetched ahead and not started, uncounted (all of them, or those that
        waited ``_hold_s``; last first: first deliveries go back to the head of the list and keep
        their order)."""
        if not self.reliable:
            return
        held: list[Message[T]] = []
        while self._ahead and (not only_waited or self._waited_s(self._ahead[0]) >= self._hold_s):
            held.append(self._ahead.popleft())
        if held:
            await asyncio.gather(*(self._settle(m, "release", 0.0) for m in reversed(held)))

    async def _interrupted(self, entry: Any, message: Message[T] | None) -> None:
        """A handler cut off by a stop: its message is nacked with no delay (bounded, through a
        forced shutdown's cancellations) and the outcome recorded for the cut's report; plain mode
        can only say so."""
        me = asyncio.current_task()
        assert me is not None
        self.stats.interrupted += 1
        if message is None:
            self._handed_back[me] = None
            log.error("worker on %r: a handler was cut off by a stop; plain mode (reliable=False) "
                      "cannot hand its item back: %r", self.queue.name, entry)
            return
        why: str | None = f"not confirmed within {_HAND_BACK_BOUND_S:.1f} s"
        self._handed_back[me] = why  # until the hand-back is answered

        async def hand_back() -> None:
            nonlocal why
            why = await self._settle(message, "nack", 0.0, report=False)

        self._settling.add(me)
        try:
            await run_through_cancellation(hand_back, _HAND_BACK_BOUND_S)
        finally:
            self._settling.discard(me)
            self._handed_back[me] = why

    async def _failed(self, item: T, message: Message[T] | None, exc: BaseException) -> None:
        if message is None:
            log.error("worker on %r: handler failed; plain mode (reliable=False) drops the item %r",
                      self.queue.name, item, exc_info=exc)
            return
        if isinstance(exc, Reject):
            self.stats.rejected += 1
            log.warning("worker on %r: handler rejected message %s; dead-lettered (%s)",
                        self.queue.name, message.id, exc)
            await self._settle(message, "dead", 0.0)
            return
        delay_s = self._retry_delay_s(exc, message.delivery_count)
        self.stats.retried += 1
        if not isinstance(exc, Retry):
            limit = _limit(message)
            then = "its last: dead-lettered" if _is_last(message) else f"retry in {delay_s:.1f} s"
            log.warning("worker on %r: handler failed on message %s (delivery %d %s); %s",
                        self.queue.name, message.id, message.delivery_count,
                        "with no limit" if limit is None else f"of {limit}", then, exc_info=exc)
        await self._settle(message, "nack", delay_s)

    def _retry_delay_s(self, exc: BaseException, delivery_count: int) -> float:
        """``Retry``'s delay, else the backoff's of the delivery count (at most
        ``BACKOFF_COUNT_CAP``); a bad value (negative, NaN, infinite, or a backoff that fails)
        becomes the backoff's, then 1 s: a retry delay never kills a slot."""
        failures = min(delivery_count, BACKOFF_COUNT_CAP)
        for delay in (getattr(exc, "delay_s", None) if isinstance(exc, Retry) else None, None):
            try:
                value = float(delay if delay is not None else self.retry_backoff.compute(failures))
            except Exception:  # the backoff is the user's: any failure falls back
                log.exception("worker on %r: retry_backoff failed; retrying in 1 s", self.queue.name)
                return 1.0
            if math.isfinite(value) and value >= 0:
                return value
        return 1.0

    async def _settle(self, message: Message[T], how: str, delay_s: float, *, report: bool = True) -> str | None:
        """Ack, nack or dead-letter; ``None`` once applied, else why not. A failure is logged (if
        ``report``): the message then comes back after its visibility timeout (at-least-once), so
        the worker goes on."""
        extending = self._extending.get(message.id)
        if extending is not None and how != "ack":
            # An EXTEND landing after this nack would move its delay to a full timeout.
            await asyncio.wait({extending})
        try:
            if how == "ack":
                applied = await message.ack()
            elif how == "dead":
                applied = await message.nack(dead_letter=True)
            elif how == "release":
                applied = await message.release()
            else:
                applied = await message.nack(delay_s)
        except BackendError as exc:
            if report:
                self._unsettled(message, how, exc)
            return str(exc) or type(exc).__name__
        return None if applied else "no longer held: its visibility timeout had ended"

    def _unsettled(self, message: Message[T], how: str, exc: BackendError) -> None:
        if isinstance(exc, NotReplicatedError):  # applied on the primary: it does not come back unless lost
            log.warning("worker on %r: the %s of message %s is not confirmed by the replicas (%s)",
                        self.queue.name, how, message.id, exc)
            return
        log.warning("worker on %r could not %s message %s (%s); it comes back after its "
                    "visibility timeout", self.queue.name, how, message.id, exc)

    async def _keep_leases(self) -> None:
        """Every third of the visibility timeout, extend the messages held for longer than that
        (running ones, and any fetched ahead: those are released before they get that old)."""
        every_s = self.visibility_timeout_s / 3
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(every_s)
            held = [m for m in self._busy.values()
                    if m is not None and not m.settled and m.remaining_s < self.visibility_timeout_s - every_s]
            if not held:
                continue
            tasks = {m.id: loop.create_task(m.extend(self.visibility_timeout_s)) for m in held}
            self._extending.update(tasks)
            try:
                await asyncio.wait(set(tasks.values()))
            finally:
                for key in tasks:
                    self._extending.pop(key, None)
            for message in held:
                task = tasks[message.id]
                if task.cancelled():
                    continue
                error = task.exception()
                if error is None and task.result() is False and not message.settled:
                    self.stats.lost_leases += 1
                    log.warning("worker on %r: message %s is no longer held (its visibility "
                                "timeout ended); it may be delivered twice", self.queue.name, message.id)
                elif isinstance(error, BackendError):  # tried again at the next tick
                    log.warning("worker on %r could not extend message %s (%s)",
                                self.queue.name, message.id, error)
                elif error is not None:
                    raise error


def _limit(message: Message[Any]) -> int | None:
    """The ``max_deliveries`` of the queue ``message`` came from (``None``: no limit)."""
    return message._settler.max_deliveries


def _is_last(message: Message[Any]) -> bool:
    """Whether ``message`` is on the last delivery its queue allows (a nack dead-letters it)."""
    limit = _limit(message)
    return limit is not None and message.delivery_count >= limit
