"""A worker: runs a handler on a queue's items with bounded concurrency (:class:`Worker`, behind
``DelayedQueue.consume``).

``concurrency`` slot tasks run the handler on what the fetch task fetched (``worker_fetch.py``).
Outcomes are in ``worker_outcomes.py`` and ``handler.py``, stopping in ``worker_stop.py``. Reliable
mode (the default) is at least once; plain mode (``reliable=False``) at most once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Generic, Literal, TypeVar

from redis.backoff import EqualJitterBackoff

from .._options import WorkerOptions
from .._util.tasks import run_through_cancellation
from .._util.tracing import process_span
from ..exceptions import ConfigurationError
from .current import CURRENT_HEADERS, CURRENT_MESSAGE
from .handler import check_handler
from .messages import Message
from .worker_fetch import Fetcher, Source
from .worker_outcomes import Outcomes, WorkerStats
from .worker_stop import CUT_BOUND_S, Shutdown

if TYPE_CHECKING:
    from opentelemetry.trace import Tracer

__all__ = ["Worker"]

log = logging.getLogger("aiodelayq")

T = TypeVar("T")
State = Literal["new", "running", "draining", "stopped"]

# While a fetch is in flight, a slot gives the loop a turn every this many messages.
_YIELD_EVERY = 8


class Worker(Generic[T]):
    """Runs ``handler(item)`` on a queue's items, at most ``concurrency`` at a time
    (:meth:`DelayedQueue.consume`). :meth:`run` returns once stopped.

    Raises:
        ConfigurationError: ``handler`` is not an async callable (:func:`check_handler`).
    """

    def __init__(self, queue: Source[T], handler: Callable[[T], Awaitable[object]], options: WorkerOptions) -> None:
        self.queue, self.handler, self.options = queue, check_handler(handler), options
        self.concurrency, self.reliable = options.concurrency, options.reliable
        self.visibility_timeout_s = options.visibility_timeout_s
        self.drain_timeout_s = options.drain_timeout_s
        self.retry_backoff = options.retry_backoff or EqualJitterBackoff(cap=300.0, base=1.0)
        self.stats = WorkerStats()
        self.state: State = "new"
        # Slot tasks, not a task per message: a handler that does not suspend goes straight on.
        self._slots: set[asyncio.Task[None]] = set()
        self._busy: dict[asyncio.Task[None], Message[T] | None] = {}
        self._stopping = asyncio.Event()
        self._abort = asyncio.Event()
        self._outcomes: Outcomes[T] = Outcomes(queue.name, self.stats, self.retry_backoff, self.visibility_timeout_s)
        self._fetcher = Fetcher(queue, self._outcomes, self._busy, concurrency=self.concurrency,
                                reliable=self.reliable, visibility_timeout_s=self.visibility_timeout_s)
        self._shutdown = Shutdown(queue.name, self.stats, self._outcomes, self._abort)

    def __repr__(self) -> str:
        return (f"<Worker {self.queue.name!r} {self.state} running={len(self._busy)}/{self.concurrency} "
                f"ahead={len(self._fetcher.ahead)} reliable={self.reliable} started={self.stats.started}>")

    @property
    def running(self) -> int:
        """Handlers running now."""
        return len(self._busy)

    def stop(self) -> None:
        """Graceful: fetch no more, let running handlers finish within ``drain_timeout_s``."""
        self._stopping.set()
        self._fetcher.wake(-1)  # idle slots end

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
        self._fetcher.closed_is_error = not self.queue.is_open
        self.state = "running"
        loop = asyncio.get_running_loop()
        name = self.queue.name
        fetcher = loop.create_task(self._fetcher.run(), name=f"aiodelayq-worker-fetch:{name}")
        keeper = (loop.create_task(self._outcomes.keep_leases(self._busy), name=f"aiodelayq-worker-leases:{name}")
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
            await self._fetcher.release()
            await self._shutdown.drain(self._slots, self._busy, self.drain_timeout_s)
        except asyncio.CancelledError:
            self.abort()
            fetcher.cancel()

            async def hand_back() -> None:
                await asyncio.wait({fetcher})
                await asyncio.gather(self._fetcher.release(), self._shutdown.cut(self._slots, self._busy))

            await run_through_cancellation(hand_back, CUT_BOUND_S + 0.3)
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

    async def _slot(self) -> None:
        """Take entries and handle them, one at a time, until stopping (plain mode first finishes
        the items already taken for it: they cannot be handed back)."""
        me = asyncio.current_task()
        assert me is not None
        fetcher, shutdown, outcomes = self._fetcher, self._shutdown, self._outcomes
        ahead, busy, stats, reliable, handler = fetcher.ahead, self._busy, self.stats, self.reliable, self.handler
        since_yield = 0
        while True:
            if self._stopping.is_set() and (reliable or not ahead):
                return
            if not ahead:
                await fetcher.park()
                continue
            # Every await of this loop comes before an entry is taken: a slot cancelled there
            # holds nothing (an entry taken is in `busy` until it is settled or handed back).
            if len(ahead) < fetcher.low_water and not fetcher.need.is_set():
                # Running low: the next fetch's reply travels while this slot works.
                fetcher.need.set()
                yielded = True
            else:  # a handler that never suspends would keep a fetch's reply from being read
                yielded = fetcher.fetching and since_yield >= _YIELD_EVERY
            if yielded:
                since_yield = 0
                await asyncio.sleep(0)
                if not ahead or self._stopping.is_set():
                    continue  # (another slot took the rest, or a stop came)
            entry = ahead.popleft()
            since_yield += 1
            if ahead and fetcher.idle and not fetcher.waking:
                fetcher.wake(1)  # more is waiting: the next slot runs when this one's handler suspends
            if reliable:
                message, item = entry, entry.value
                CURRENT_MESSAGE.set(message)
            else:  # an (item, headers) pair
                message, (item, headers) = None, entry
                CURRENT_HEADERS.set(headers)
            busy[me] = message
            stats.started += 1
            # Inline, not in a helper coroutine: every layer per message costs (the drain benchmark).
            found = fetcher.tracer
            try:
                if found is None:
                    await handler(item)
                else:
                    await self._traced(found, item, message, headers if message is None else message.headers)
            except (asyncio.CancelledError, Exception) as exc:
                if isinstance(exc, asyncio.CancelledError) and shutdown.cut_off(me):
                    await shutdown.interrupted(item, message)
                    raise
                # The handler's failure (a cancellation it ran into on its own included): settle
                # it, never let it kill the worker.
                stats.failed += 1
                await shutdown.settling_in(me, outcomes.failed(item, message, exc))
            else:
                stats.succeeded += 1
                # A confirmed ack makes the slot wait; waiting slots' acks share the next SETTLE call.
                if message is not None and not message._ack_behind():
                    await shutdown.settling_in(me, outcomes.settle(message, "ack", 0.0))
            finally:
                del busy[me]

    async def _traced(self, found: Tracer, item: T, message: Message[T] | None, headers: dict[str, str]) -> None:
        """The handler's call inside a ``process`` span, the child of the item's producer context."""
        with process_span(found, self.queue.name, headers, None if message is None else message.id,
                          None if message is None else message.delivery_count):
            await self.handler(item)
