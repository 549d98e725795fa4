"""A delivery of the reliable consumer (:class:`Message`) and how it is settled."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Generic, TypeVar

from .._wire.delays import delay_to_ms, visibility_ms
from ..exceptions import InvalidDelayError
from .lease import Lease
from .settler import Settle, Settler

__all__ = ["Message"]

T = TypeVar("T")


@dataclass(eq=False)
class Message(Generic[T]):
    """One delivery of a queue item, in flight until :meth:`ack` or :meth:`nack`.

    Attributes:
        value: the decoded item.
        id: the message id (hex), stable across redeliveries.
        delivery_count: 1 for the first delivery, then +1 per redelivery.
        due_ms: when this delivery became due, epoch ms of the server clock: the end of the previous
            visibility timeout or nack delay; ``None`` for a first delivery (the destination list
            carries only the payload, as Redisson's does).
        deadline_ms: the end of this delivery's visibility timeout, epoch ms of the server clock.
        expires_at_ms: when it expires, epoch ms of the server clock (``None``: never): a delivery
            due at or after it is not made (the item goes to the dead-letter list, reason
            ``"expired"``).
    """

    value: T
    id: str
    delivery_count: int
    due_ms: int | None
    deadline_ms: int
    _settler: Settler = field(repr=False)
    _element: bytes = field(repr=False)
    # deadline_ms on this process's loop clock, never later than the true one (counted from when
    # the receive call was sent, which is before the server read its clock).
    _expires: float = field(repr=False, default=0.0)
    _vt_ms: int = field(repr=False, default=0)  # the visibility timeout it was received with
    _settled: bool = field(repr=False, default=False)
    _headers: dict[str, str] | None = field(repr=False, default=None)  # None: none (no dict per message)
    expires_at_ms: int | None = None

    @property
    def headers(self) -> dict[str, str]:
        """The headers it was offered with (``{}`` when none)."""
        return {} if self._headers is None else self._headers

    @property
    def settled(self) -> bool:
        """Whether this delivery was acked, nacked or released by this process (its answer known,
        or its ack written behind)."""
        return self._settled

    @property
    def remaining_s(self) -> float:
        """Seconds left of this delivery's visibility timeout, as this process can tell (a lower
        bound); negative once it has passed."""
        return self._expires - asyncio.get_running_loop().time()

    async def ack(self, *, confirm: bool | None = None) -> bool:
        """Done: remove the message for good. ``False`` if it was no longer in flight as this
        delivery (already settled, or its visibility timeout ended and it was delivered again).

        ``confirm=None`` (the default) follows the queue: written behind without durable writes,
        confirmed with them (``min_replicas`` or ``wait_aof``). ``confirm=True`` always waits;
        ``confirm=False`` writes behind even on a durable queue.

        Written behind: the ack is sent with the next settle call, without waiting for its answer,
        when its outcome is already known: nobody else can settle this delivery before its
        deadline, and more than ``call_timeout_s`` of it is left, so it lands in time unless Redis
        cannot be reached at all. Then ``True`` comes back at once, and if the write does fail (or,
        on a durable queue, is not confirmed by the replicas), that is logged (WARNING), counted in
        ``stats.unconfirmed_settles``, and unless it landed the message is delivered again after its
        visibility timeout: at-least-once, never a loss. Closer to the deadline, or after the queue
        was closed, the call waits for Redis's answer whatever ``confirm`` says.

        Confirmed: the call returns once Redis answered and, on a durable queue, once
        ``min_replicas`` replicas (and the AOF fsync with ``wait_aof``) have the ack, so a replica
        read right after it no longer shows the message in flight. Concurrent acks share calls.

        Raises:
            NotReplicatedError: (confirmed, durable queue) the ack ran on the primary but was not
                confirmed within ``replication_timeout_s`` (``maybe_applied`` is ``True``): the message
                is not delivered again unless a failover loses the ack. Acking again does not tell
                (the delivery is gone from the primary: ``False``, or this error again).
            BackendError: (confirmed) the call failed within ``call_timeout_s``: the message stays in
                flight until its deadline; ``maybe_applied`` tells whether the ack may have landed.
        """
        if self._settled:
            return False
        if self._ack_behind(confirm):
            return True
        return await self._settle(Settle(self._element, "ack", self.deadline_ms))

    def _ack_behind(self, confirm: bool | None = None) -> bool:
        """The no-wait part of :meth:`ack`, without a coroutine (a worker's fast path): ``True`` if
        the ack was written behind; ``False`` if it must be confirmed (call :meth:`ack`): asked for,
        the queue's default (durable writes), or too close to its deadline."""
        settler = self._settler
        if (settler.acks_confirmed if confirm is None else confirm) or self._settled:
            return False
        if settler.ack_behind(self._element, self.deadline_ms, self._expires):
            self._settled = True
            return True
        return False

    async def nack(self, delay: float = 0.0, *, dead_letter: bool = False) -> bool:
        """Give the message back: visible again after ``delay`` seconds (a redelivery: it counts). If
        this was the last delivery ``max_deliveries`` allows, it goes to the dead-letter list at
        once (reason ``"max_deliveries"``). With ``dead_letter=True`` it goes there now, whatever is
        left (reason ``"nacked"``; ``delay`` is ignored): for items no retry can fix. ``False`` as
        for :meth:`ack`. Always waits for Redis's answer (and, on a durable queue, its replicas').

        Raises:
            InvalidDelayError: a negative, NaN or infinite delay.
            NotReplicatedError, BackendError: as a confirmed :meth:`ack`.
        """
        delay_ms = delay_to_ms(delay)
        if self._settled:
            return False
        if dead_letter:
            return await self._settle(Settle(self._element, "dead", self.deadline_ms))
        return await self._settle(Settle(self._element, "nack", self.deadline_ms, delay_ms))

    async def release(self) -> bool:
        """Hand the message back as if this delivery never happened: visible again at once, its
        ``delivery_count`` not raised (a first delivery goes back to the head of the list). For
        messages fetched ahead and never worked on (a worker's unstarted ones at shutdown); a
        message that was worked on should be nacked. ``False`` as for :meth:`ack`. Always waits,
        as :meth:`nack`.

        Raises:
            NotReplicatedError, BackendError: as a confirmed :meth:`ack`.
        """
        if self._settled:
            return False
        return await self._settle(Settle(self._element, "release", self.deadline_ms))

    async def extend(self, visibility_timeout: float | timedelta) -> bool:
        """Keep the message: its visibility deadline becomes now + ``visibility_timeout`` (server
        clock; shorter than what is left makes it sooner). ``False`` if it is no longer held by this
        delivery (settled, or its deadline passed and it was delivered again).

        Raises:
            InvalidDelayError: a bad timeout (at least 1 ms).
            BackendError: the call failed within ``call_timeout_s`` (the deadline may have moved).
        """
        vt_ms = visibility_ms(visibility_timeout)
        if self._settled:
            return False
        sent = asyncio.get_running_loop().time()
        deadline = await self._settler.extend(self._element, vt_ms)
        if deadline is None:
            return False
        self.deadline_ms = deadline
        self._expires = sent + vt_ms / 1000  # counted from the send: never later than the true one
        return True

    def lease(self, visibility_timeout: float | timedelta | None = None, *, every: float | None = None) -> Lease:
        """``async with msg.lease(): ...`` keeps the message while a long job runs: every ``every``
        seconds (default: a third of the timeout) its deadline becomes now + ``visibility_timeout``
        (default: the timeout it was received with), until the block exits or is cancelled. See
        :class:`~aiodelayq._consuming.lease.Lease` for failures (``lost``).

        Raises:
            InvalidDelayError: a bad timeout or interval.
        """
        vt_ms = self._vt_ms if visibility_timeout is None else visibility_ms(visibility_timeout)
        every_s = vt_ms / 3000 if every is None else delay_to_ms(every) / 1000
        if every_s <= 0 or every_s * 1000 >= vt_ms:
            raise InvalidDelayError(f"lease interval must be > 0 and shorter than the visibility timeout ({vt_ms} ms)")
        return Lease(self.extend, visibility_timeout_s=vt_ms / 1000, every_s=every_s, label=f"message {self.id}")

    async def _settle(self, settle: Settle) -> bool:
        result = await self._settler.confirmed(settle)
        if result:
            self._settled = True
        return bool(result)
