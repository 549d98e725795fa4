"""What becomes of a worker's messages once fetched: acked after their handler, retried with a
backoff or dead-lettered after a failure (:class:`~aiodelayq._consuming.handler.Retry`,
:class:`~aiodelayq._consuming.handler.Reject`), released when fetched ahead for nothing; their
leases extended while their handler runs; and the counts of it all (:class:`WorkerStats`).

Plain mode (``reliable=False``) can only log a failure with the item: the item is gone.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from redis.backoff import AbstractBackoff

from ..exceptions import BackendError, NotReplicatedError
from .handler import Reject, Retry
from .messages import Message

__all__ = ["BACKOFF_COUNT_CAP", "Outcomes", "WorkerStats", "is_last"]

log = logging.getLogger("aiodelayq")

T = TypeVar("T")

BACKOFF_COUNT_CAP = 64
"""The largest delivery count a worker passes to its ``retry_backoff.compute``: an exponential
backoff is at its cap long before (2**64 times its base), and redis-py's own overflow (an
``OverflowError`` from about 2**1024) is never reached, however often a message comes back."""


@dataclass
class WorkerStats:
    """What a worker did so far.

    Attributes:
        started: handlers started. succeeded: handlers that returned. failed: handlers that raised
            (:class:`Retry` and :class:`Reject` included). retried: messages nacked for a retry.
        rejected: messages dead-lettered by :class:`Reject`. interrupted: handlers ended by a stop's
            cancellation (their messages handed back, or back after their visibility timeout).
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


class Outcomes(Generic[T]):
    """Settles the messages of the worker on queue ``name`` and keeps their leases; counts into ``stats``."""

    def __init__(self, name: str, stats: WorkerStats, retry_backoff: AbstractBackoff,
                 visibility_timeout_s: float) -> None:
        self._name, self._stats, self._retry_backoff = name, stats, retry_backoff
        self._visibility_timeout_s = visibility_timeout_s
        self._extending: dict[str, asyncio.Task[bool]] = {}  # message id -> its extend in flight

    async def failed(self, item: T, message: Message[T] | None, exc: BaseException) -> None:
        """The handler of ``item`` (``message``; ``None`` in plain mode) raised ``exc``."""
        if message is None:
            log.error("worker on %r: handler failed; plain mode (reliable=False) drops the item %r",
                      self._name, item, exc_info=exc)
            return
        if isinstance(exc, Reject):
            self._stats.rejected += 1
            log.warning("worker on %r: handler rejected message %s; dead-lettered (%s)",
                        self._name, message.id, exc)
            await self.settle(message, "dead", 0.0)
            return
        delay_s = self.retry_delay_s(exc, message.delivery_count)
        self._stats.retried += 1
        if not isinstance(exc, Retry):
            limit = _limit(message)
            then = "its last: dead-lettered" if is_last(message) else f"retry in {delay_s:.1f} s"
            log.warning("worker on %r: handler failed on message %s (delivery %d %s); %s",
                        self._name, message.id, message.delivery_count,
                        "with no limit" if limit is None else f"of {limit}", then, exc_info=exc)
        await self.settle(message, "nack", delay_s)

    def retry_delay_s(self, exc: BaseException, delivery_count: int) -> float:
        """``Retry``'s delay, else the backoff's of the delivery count (at most
        ``BACKOFF_COUNT_CAP``); a bad value (negative, NaN, infinite, or a backoff that fails)
        becomes the backoff's, then 1 s: a retry delay never kills a slot."""
        failures = min(delivery_count, BACKOFF_COUNT_CAP)
        for delay in (getattr(exc, "delay_s", None) if isinstance(exc, Retry) else None, None):
            try:
                value = float(delay if delay is not None else self._retry_backoff.compute(failures))
            except Exception:  # the backoff is the user's: any failure falls back
                log.exception("worker on %r: retry_backoff failed; retrying in 1 s", self._name)
                return 1.0
            if math.isfinite(value) and value >= 0:
                return value
        return 1.0

    async def settle(self, message: Message[T], how: str, delay_s: float, *, report: bool = True) -> str | None:
        """Ack, nack or dead-letter; ``None`` once applied, else why not (logged if ``report``; the
        message then comes back after its visibility timeout)."""
        extending = self._extending.get(message.id) if self._extending else None
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
                        self._name, how, message.id, exc)
            return
        log.warning("worker on %r could not %s message %s (%s); it comes back after its "
                    "visibility timeout", self._name, how, message.id, exc)

    async def keep_leases(self, busy: Mapping[Any, Message[T] | None]) -> None:
        """Every third of the visibility timeout, extend the messages of ``busy`` held for longer
        than that (running ones, and any fetched ahead: those are released before they get that old)."""
        vt_s = self._visibility_timeout_s
        every_s = vt_s / 3
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(every_s)
            held = [m for m in busy.values() if m is not None and not m.settled and m.remaining_s < vt_s - every_s]
            if not held:
                continue
            tasks = {m.id: loop.create_task(m.extend(vt_s)) for m in held}
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
                    self._stats.lost_leases += 1
                    log.warning("worker on %r: message %s is no longer held (its visibility "
                                "timeout ended); it may be delivered twice", self._name, message.id)
                elif isinstance(error, BackendError):  # tried again at the next tick
                    log.warning("worker on %r could not extend message %s (%s)", self._name, message.id, error)
                elif error is not None:
                    raise error


def _limit(message: Message[Any]) -> int | None:
    """The ``max_deliveries`` of the queue ``message`` came from (``None``: no limit)."""
    return message._settler.max_deliveries


def is_last(message: Message[Any]) -> bool:
    """Whether ``message`` is on the last delivery its queue allows (a nack dead-letters it)."""
    limit = _limit(message)
    return limit is not None and message.delivery_count >= limit
