"""Several queues as one source for a worker, by priority (:class:`Prioritized`).

Priorities live between queues, not inside one: a ready list is Redisson's FIFO list. A fetch asks
each queue once without waiting, in order; when all are empty it waits on all and takes the first
answer (cancelling the other waits hands back what they popped).
"""

from __future__ import annotations

import asyncio
import math
import random
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

from .._options import WorkerOptions
from .._util.tasks import wait_through_cancellation
from ..exceptions import ConfigurationError
from .messages import Message
from .worker_fetch import Source
from .worker_slots import Worker

__all__ = ["Prioritized"]

T = TypeVar("T")
R = TypeVar("R")

# How long a fetch waits for the waits it cancelled to hand back what they popped.
_UNDO_BOUND_S = 1.0


class Prioritized(Generic[T]):
    """Several queues as one source for a :class:`~aiodelayq.Worker`: ``Worker(Prioritized([urgent,
    normal, bulk]), handler, WorkerOptions())``, or :meth:`worker`.

    Without ``weights`` the order is strict (a busy first queue starves the others). With ``weights``
    (one positive number per queue) each fetch draws the order at random, a queue first with a
    probability proportional to its weight, so none starves.

    Raises:
        ConfigurationError: no queues, a queue given twice, or weights that are not one positive
            finite number per queue.
    """

    def __init__(self, queues: Sequence[Source[T]], *, weights: Sequence[float] | None = None,
                 rng: random.Random | None = None) -> None:
        self.queues = list(queues)
        if not self.queues:
            raise ConfigurationError("queues must name at least one queue")
        if len({id(q) for q in self.queues}) != len(self.queues):
            raise ConfigurationError("queues must not name a queue twice")
        if weights is not None:
            weights = list(weights)
            if len(weights) != len(self.queues) or not all(
                    isinstance(w, (int, float)) and not isinstance(w, bool) and math.isfinite(w) and w > 0
                    for w in weights):
                raise ConfigurationError(f"weights must be one positive number per queue, got {weights!r}")
        self.weights = weights
        self._rng = rng or random.Random()

    def __repr__(self) -> str:
        how = "strict" if self.weights is None else f"weights={self.weights}"
        return f"<Prioritized {[q.name for q in self.queues]} {how}>"

    @property
    def name(self) -> str:
        """The queues' names, ``|``-joined (in logs)."""
        return "|".join(q.name for q in self.queues)

    @property
    def is_open(self) -> bool:
        """Whether every queue is open."""
        return all(q.is_open for q in self.queues)

    @property
    def max_deliveries(self) -> int | None:
        """The queues' ``max_deliveries`` when they share one, else ``None`` (each queue applies its
        own, and the worker reads each message's)."""
        limits = {q.max_deliveries for q in self.queues}
        return limits.pop() if len(limits) == 1 else None

    def worker(self, handler: Callable[[T], Awaitable[object]], options: WorkerOptions | None = None) -> Worker[T]:
        """A :class:`~aiodelayq.Worker` on these queues (``options``: :class:`~aiodelayq.WorkerOptions`,
        their defaults by default): ``await worker.run()`` until ``worker.stop()``."""
        return Worker(self, handler, options or WorkerOptions())

    def order(self) -> list[Source[T]]:
        """The queues in the order the next fetch tries them."""
        if self.weights is None:
            return list(self.queues)
        pool, weights, order = list(self.queues), list(self.weights), []
        while pool:
            index = self._rng.choices(range(len(pool)), weights)[0]
            order.append(pool.pop(index))
            weights.pop(index)
        return order

    async def receive_many(self, max_items: int, visibility_timeout: float,
                           timeout: float | None = None) -> list[Message[T]]:
        """Messages of the first queue (in :meth:`order`) that has some; ``[]`` after ``timeout``."""
        return await self._fetch(lambda q, t: q.receive_many(max_items, visibility_timeout, t), timeout)

    async def take_many_with_headers(self, max_items: int, timeout: float | None = None
                                     ) -> list[tuple[T, dict[str, str]]]:
        """Items of the first queue (in :meth:`order`) that has some, with their headers."""
        return await self._fetch(lambda q, t: q.take_many_with_headers(max_items, t), timeout)

    async def _fetch(self, call: Callable[[Source[T], float | None], Awaitable[list[R]]],
                     timeout: float | None) -> list[R]:
        for queue in self.order():
            first = await call(queue, 0)  # one call, no waiting
            if first:
                return first
        if timeout == 0:
            return []
        waits = [asyncio.ensure_future(call(queue, timeout)) for queue in self.queues]
        cancelled = False
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            cancelled = True
        for wait in waits:
            wait.cancel()  # hands back what it popped (a cancelled receive/take undoes its call)
        # Through this task's own cancellation: a wait that finished keeps its items, and they must
        # reach the caller rather than be dropped with the cancellation.
        cancelled = await wait_through_cancellation(set(waits), _UNDO_BOUND_S) or cancelled
        got: list[R] = []
        failure: BaseException | None = None
        for wait in waits:  # priority order
            if not wait.done() or wait.cancelled():
                continue
            if wait.exception() is not None:
                failure = failure or wait.exception()
            else:
                got.extend(wait.result())
        if cancelled:
            if not got:
                raise asyncio.CancelledError
            # The items go to the caller first; the cancellation follows at its next await.
            current = asyncio.current_task()
            assert current is not None
            current.cancel()
        elif not got and failure is not None:
            raise failure
        return got
