"""A worker's fetch task and the entries it fetched that no slot has taken yet.

One fetch receives for the free slots plus up to ``max_ahead`` more (reliable mode), and the next
goes out while the slots work, else every slot waits a round trip per message. A message that waited
``hold_s`` for a slot is released, uncounted, so slow handlers do not hoard work; fetching ahead
then restarts at 1 and doubles. Plain mode fetches only for free slots: a taken item cannot go back.

Idle slots park here; each slot that takes an entry while more wait wakes the next, so a handler
that never suspends drains the deque alone without waking the others for nothing.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from .._redis.backoff import Backoff
from .._util.tasks import wait_event
from .._util.tracing import tracer
from ..exceptions import AccessDeniedError, BackendError, QueueClosedError, WrongNodeError
from .messages import Message
from .worker_outcomes import Outcomes

if TYPE_CHECKING:
    from opentelemetry.trace import Tracer

__all__ = ["Fetcher", "Source"]

T = TypeVar("T")

# Longest a message fetched ahead waits for a free slot before it is released for other consumers.
_AHEAD_HOLD_S = 0.5


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


class Fetcher(Generic[T]):
    """Fetches for a worker's ``concurrency`` slots; ``busy``: the slots' running messages."""

    def __init__(self, queue: Source[T], outcomes: Outcomes[T], busy: Mapping[Any, object], *,
                 concurrency: int, reliable: bool, visibility_timeout_s: float) -> None:
        self._queue, self._outcomes, self._busy = queue, outcomes, busy
        self._concurrency, self._reliable, self._visibility_timeout_s = concurrency, reliable, visibility_timeout_s
        # Fetched entries no slot took yet: messages, or (item, headers) pairs in plain mode.
        self.ahead: collections.deque[Any] = collections.deque()
        self._cap = max(concurrency, 128) if reliable else 0
        self._max_ahead = self._cap
        self.low_water = max(1, self._max_ahead)  # fewer entries waiting: fetch more
        self.need = asyncio.Event()
        self.fetching = False  # a fetch is in flight
        self._hold_s = min(_AHEAD_HOLD_S, visibility_timeout_s / 4)
        self.closed_is_error = False  # a closed queue ends the fetch with an error, not cleanly
        self.idle: collections.deque[asyncio.Future[None]] = collections.deque()  # parked slots
        self.waking = 0  # slots woken that have not run yet
        # The tracer the slots use, read once per fetch rather than per message (a provider set
        # meanwhile traces from the next fetch): None without an SDK.
        self.tracer: Tracer | None = None

    def __repr__(self) -> str:
        return f"<Fetcher ahead={len(self.ahead)}/{self._max_ahead} fetching={self.fetching} parked={len(self.idle)}>"

    def wake(self, count: int) -> None:
        """Wake up to ``count`` parked slots (every one with ``count`` < 0)."""
        idle = self.idle
        while idle and count != 0:
            parked = idle.popleft()
            if not parked.done():
                parked.set_result(None)
                self.waking += 1
                count -= 1

    async def park(self) -> None:
        """A slot found nothing waiting: fetch more (and, in reliable mode, again further ahead), and
        wait until woken for an entry (one slot per entry fetched, not all of them)."""
        if self._max_ahead < self._cap:
            self._max_ahead = min(self._cap, max(1, self._max_ahead * 2))
        self.need.set()
        parked = asyncio.get_running_loop().create_future()
        self.idle.append(parked)
        await parked
        self.waking -= 1

    async def run(self) -> None:
        """Fetch until the queue closes (an error if ``closed_is_error``) or a permanent error."""
        backoff = Backoff(f"fetch of the worker on {self._queue.name!r}")
        ahead = self.ahead
        while True:
            if self._reliable and ahead and self._waited_s(ahead[0]) >= self._hold_s:
                self._max_ahead = 0  # handlers are slower than the fetches
                await self.release(only_waited=True)
            want = self._concurrency + self._max_ahead - len(self._busy) - len(ahead)
            # While messages wait, every wait is short, so the check above runs in time.
            check_s = self._hold_s / 2 if ahead else None
            if want <= 0 or len(ahead) >= self.low_water:
                self.need.clear()
                await wait_event(self.need, check_s)
                continue
            try:
                self.fetching = True
                try:
                    if self._reliable:
                        fetched: list[Any] = await self._queue.receive_many(want, self._visibility_timeout_s, check_s)
                    else:
                        fetched = await self._queue.take_many_with_headers(want)
                finally:
                    self.fetching = False
                ahead.extend(fetched)
                self.tracer = tracer()
            except QueueClosedError:
                if self.closed_is_error:
                    raise
                return
            except BackendError as exc:
                if isinstance(exc, (AccessDeniedError, WrongNodeError)):
                    raise  # permanent: no retry can fix a missing permission or a wrong node
                await asyncio.sleep(backoff.failed(exc))
                continue
            backoff.succeeded()
            if fetched and not self.waking:
                self.wake(1)

    def _waited_s(self, message: Message[T]) -> float:
        """How long ``message`` has been held since it was received (or last extended), seconds."""
        return self._visibility_timeout_s - message.remaining_s

    async def release(self, *, only_waited: bool = False) -> None:
        """Hand back messages fetched ahead and not started, uncounted (all of them, or those that
        waited ``hold_s``; last first: first deliveries go back to the head of the list and keep
        their order)."""
        if not self._reliable:
            return
        held: list[Message[T]] = []
        while self.ahead and (not only_waited or self._waited_s(self.ahead[0]) >= self._hold_s):
            held.append(self.ahead.popleft())
        if held:
            await asyncio.gather(*(self._outcomes.settle(m, "release", 0.0) for m in reversed(held)))
