"""Reliable (at-least-once) consumption: messages in flight until acknowledged.

A received message sits in the in-flight zset, scored by its visibility deadline (server ms). ``ack``
removes it; ``nack(delay)`` makes it visible again after ``delay``; a message neither acked nor
nacked becomes visible again at its deadline. Each redelivery counts; past ``max_deliveries`` the
payload goes to the dead-letter list. RECEIVE pops and registers in one atomic step, under a call
id: a lost reply is resent and returns the same messages, and a cancelled caller's call is undone
by id (RELEASE_CALL), so nothing is counted as delivered that nobody saw.
"""

from __future__ import annotations

import asyncio
import logging
import os
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, TypeVar, cast

from redis.asyncio import Redis

from ._codec import decode_item
from ._connections import Script, run_script
from ._delays import delay_to_ms
from ._elements import parse_message
from ._keys import QueueKeys
from ._options import QueueOptions
from ._retry import resend_within, retry_until_done
from ._scripts.reliable import RECEIVE, RELEASE_CALL, SETTLE
from ._tasks import keep, run_through_cancellation
from .exceptions import BackendError, DecodeError, QueueClosedError

__all__ = ["Message", "MessageIterator", "ReliableConsumer", "SettleMode"]

log = logging.getLogger("aiodelayq")

T = TypeVar("T")

SettleMode = Literal["ack", "nack", "dead", "release"]
"""What SETTLE does with one delivery: remove it (ack), make it visible again after a delay (nack),
move its payload to the dead-letter list (dead), or undo it as if never received (release)."""

# Longest a waiting receiver sleeps without a wake-up: the scheduler's transfers wake it sooner.
_RECHECK_S = 5.0
# How long a cancelled receive() spends undoing its call before the cancellation propagates.
_UNDO_BOUND_S = 0.5


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
    """

    value: T
    id: str
    delivery_count: int
    due_ms: int | None
    deadline_ms: int
    _consumer: ReliableConsumer[Any] = field(repr=False)
    _element: bytes = field(repr=False)

    async def ack(self) -> bool:
        """Done: remove the message for good. ``False`` if it was no longer in flight as this delivery
        (already settled, or its visibility timeout ended and it was delivered again).

        Raises:
            BackendError: the Redis call failed within ``call_timeout_s`` (the message then stays in
                flight until its deadline; ``maybe_applied`` tells whether the ack may have landed).
        """
        return await self._consumer.settle(self, "ack")

    async def nack(self, delay: float = 0.0) -> bool:
        """Give the message back: visible again after ``delay`` seconds (a redelivery: it counts). If
        this was the last delivery ``max_deliveries`` allows, it goes to the dead-letter list at
        once. ``False`` as for :meth:`ack`.

        Raises:
            InvalidDelayError: a negative, NaN or infinite delay.
            BackendError: as :meth:`ack`.
        """
        return await self._consumer.settle(self, "nack", delay_ms=delay_to_ms(delay))


class ReliableConsumer(Generic[T]):
    """``receive``/``receive_many`` and the settles of one queue object."""

    def __init__(self, client: Redis, keys: QueueKeys, options: QueueOptions) -> None:
        self._client, self._keys, self._codec = client, keys, options.codec
        self._max_deliveries, self._call_timeout_s = options.max_deliveries, options.call_timeout_s
        # Replaced on every notify: a receiver takes the current one before it asks Redis, so a
        # wake-up during its call is never lost, and one receiver never consumes another's.
        self._signal: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._side_tasks: set[asyncio.Future[Any]] = set()
        self._closed = False
        self.undecodable = 0
        self.exhausted = 0

    def __repr__(self) -> str:
        return f"<ReliableConsumer {self._keys.destination!r} side_tasks={len(self._side_tasks)}>"

    def notify(self) -> None:
        """Items may be due now: every waiting receiver looks again."""
        if not self._signal.done():
            self._signal.set_result(None)
        self._signal = asyncio.get_running_loop().create_future()

    async def receive_many(self, max_items: int, vt_ms: int, timeout_s: float | None) -> list[Message[T]]:
        """Up to ``max_items`` messages, waiting up to ``timeout_s`` (``None``: forever); ``[]`` after."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout_s is None else loop.time() + timeout_s
        while True:
            if self._closed:
                raise QueueClosedError(f"queue {self._keys.destination!r} was closed")
            signal = self._signal
            messages, wait_s = await self._receive_once(max_items, vt_ms)
            if messages:
                return messages
            if deadline is not None:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    return []
                wait_s = min(wait_s, remaining)
            await asyncio.wait({signal}, timeout=wait_s)

    async def _receive_once(self, max_items: int, vt_ms: int) -> tuple[list[Message[T]], float]:
        k = self._keys
        call_id = os.urandom(16)
        try:
            # A cancellation here drops the exchange's connection (see _connections.call).
            reply = await self._call(RECEIVE, [k.destination, k.in_flight, k.dead_letter, k.calls, k.call_replies],
                                     [max_items, vt_ms, self._max_deliveries, call_id], "receive")
        except asyncio.CancelledError:
            # The call may have received messages nobody will see: undo it by its id (or make a
            # late arrival of it receive nothing), without counting a delivery. This caller waits
            # for it, at most _UNDO_BOUND_S and through further cancellations (a forced shutdown
            # cancels every task again, the undo's too), so asyncio.run does not close the loop
            # under it. Then the cancellation propagates.
            if not await self._undo_within(call_id, _UNDO_BOUND_S):
                self._spawn(self._release_call(call_id))  # keeps trying unless the loop is going away
            raise
        except BackendError as exc:
            if exc.maybe_applied:
                self._spawn(self._release_call(call_id))
            raise
        now_ms, head, dead = int(reply[0]), reply[1], int(reply[2])
        if dead:
            self.exhausted += dead
            log.error("aiodelayq: %d message(s) of %r exceeded max_deliveries=%d; moved to dead-letter list %r",
                      dead, k.destination, self._max_deliveries, k.dead_letter)
        wait_s = _RECHECK_S if head is None else min(_RECHECK_S, max(0.001, (float(head) - now_ms) / 1000))
        messages: list[Message[T]] = []
        for element in reply[3:]:
            message_id, count, due_ms, payload = parse_message(element)
            try:
                value = decode_item(self._codec, payload)
            except DecodeError as exc:
                self.undecodable += 1
                log.error("aiodelayq: %s; moved to dead-letter list %r", exc, k.dead_letter)
                raw: Message[Any] = Message(None, message_id, count, due_ms, now_ms + vt_ms, self, element)
                try:
                    await self.settle(raw, "dead")  # atomic: out of flight and into the list
                except BackendError as err:
                    log.warning("aiodelayq: could not dead-letter it now (%s); it stays in flight", err)
                continue
            messages.append(Message(cast(T, value), message_id, count, due_ms, now_ms + vt_ms, self, element))
        return messages, wait_s

    async def settle(self, message: Message[Any], mode: SettleMode, *, delay_ms: int = 0) -> bool:
        """Settle one delivery (see :data:`SettleMode`; ``delay_ms`` for a nack); ``True`` if it was
        still in flight as this delivery.

        Raises:
            BackendError: the call failed within ``call_timeout_s`` (``maybe_applied`` as usual).
        """
        k = self._keys
        keys = [k.in_flight, k.dead_letter, k.destination, k.channel]
        async def attempt(remaining_s: float, resend: bool) -> Any:
            # A resend names the message's deadline: the script can tell "my first try applied it".
            args = [message._element, mode, delay_ms, self._max_deliveries, str(message.deadline_ms) if resend else ""]
            return await run_script(self._client, SETTLE, keys, args, timeout_s=remaining_s,
                                    what=f"{mode} on {k.destination!r}")

        # Shielded: a caller that leaves does not cut the settle off half-way (it completes, bounded).
        result = await asyncio.shield(self._spawn(resend_within(attempt, timeout_s=self._call_timeout_s)))
        if int(result) == 2:
            # Per message: counted (stats.exhausted) and visible in the dead-letter list, logged at DEBUG.
            self.exhausted += 1
            log.debug("aiodelayq: a message of %r was nacked on its last allowed delivery (max_deliveries=%d); "
                      "moved to dead-letter list %r", k.destination, self._max_deliveries, k.dead_letter)
        return bool(int(result))

    async def _call(self, script: Script, keys: list[str], args: list[Any], what: str,
                    timeout_s: float | None = None) -> Any:
        """A call with a call id: resent with the same id after a lost reply, within ``timeout_s``
        (default ``call_timeout_s``)."""
        return await resend_within(
            lambda remaining_s, _resend: run_script(self._client, script, keys, args, timeout_s=remaining_s,
                                                    what=f"{what} on {self._keys.destination!r}"),
            timeout_s=self._call_timeout_s if timeout_s is None else timeout_s)

    async def _release(self, call_id: bytes, timeout_s: float | None = None) -> None:
        """RELEASE_CALL of a receive call id (idempotent), within ``timeout_s``."""
        k = self._keys
        await self._call(RELEASE_CALL, [k.in_flight, k.destination, k.calls, k.call_replies], [call_id],
                         "undo a cancelled receive", timeout_s)

    async def _undo_within(self, call_id: bytes, timeout_s: float) -> bool:
        """RELEASE_CALL within ``timeout_s``, through cancellations; returns whether it was applied."""
        done = False

        async def release() -> None:
            nonlocal done
            await self._release(call_id, timeout_s)
            done = True

        await run_through_cancellation(release, timeout_s)
        return done

    async def _release_call(self, call_id: bytes) -> None:
        """RELEASE_CALL in the background until done (it is idempotent), or the queue closes."""
        try:
            await retry_until_done(lambda timeout_s: self._release(call_id, timeout_s),
                                   per_try_s=self._call_timeout_s, stopped=lambda: self._closed)
        except BackendError as exc:
            log.warning("aiodelayq: could not undo a cancelled receive on %r (%s); its messages come back "
                        "after their visibility timeout", self._keys.destination, exc)

    def _spawn(self, work: Any) -> asyncio.Future[Any]:
        """A side task this consumer owns: :meth:`aclose` waits for it (bounded), then cancels it."""
        task: asyncio.Future[Any] = keep(asyncio.ensure_future(work))
        self._side_tasks.add(task)
        task.add_done_callback(self._side_tasks.discard)
        return task

    async def aclose(self, deadline: float) -> None:
        """Wake receivers (they raise :class:`QueueClosedError`) and wait for side tasks (undoing
        cancelled receives) until ``deadline`` (loop time); then cancel what is left."""
        self._closed = True
        self.notify()
        loop = asyncio.get_running_loop()
        if self._side_tasks:
            await asyncio.wait(set(self._side_tasks), timeout=max(0.0, deadline - loop.time()))
        left = set(self._side_tasks)
        for task in left:
            task.cancel()
        if left:  # cancelled calls drop their connections within a loop turn or two
            await asyncio.wait(left, timeout=0.1)


class MessageIterator(Generic[T]):
    """``async for msg in queue.messages(visibility_timeout)``: receives until the queue is closed."""

    def __init__(self, consumer: ReliableConsumer[T], vt_ms: int) -> None:
        self._consumer = consumer
        self._vt_ms = vt_ms

    def __aiter__(self) -> MessageIterator[T]:
        return self

    async def __anext__(self) -> Message[T]:
        try:
            [message] = await self._consumer.receive_many(1, self._vt_ms, None)
        except QueueClosedError:
            raise StopAsyncIteration from None
        return message
