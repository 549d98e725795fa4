"""Settles (ack, nack, dead, release) of one queue's messages, coalesced into SETTLE calls.

While one SETTLE call is in flight, the settles that arrive wait and go out together in the next,
so concurrent handlers and prefetched messages share round trips. A settle is either *confirmed*
(its caller awaits the script's answer, errors included) or *written behind* (nobody waits: an
``ack()`` the consumer knows must apply if it reaches Redis, or the release of prefetched messages
nobody came for). A written-behind settle that cannot be confirmed is logged and counted; its
message is then delivered again after its visibility timeout (at-least-once: never a loss). On a
queue with durable writes every call waits for the replicas, and acks are confirmed by default
(:attr:`Settler.acks_confirmed`): ``ack()`` returns once the replicas have it.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from .._redis.retry import resend_within
from .._scripts import QueueScripts
from .._util.observe import Events
from .._util.tasks import TaskOwner
from ..exceptions import BackendError

__all__ = ["Settle", "SettleMode", "Settler"]

log = logging.getLogger("aiodelayq")

SettleMode = Literal["ack", "nack", "dead", "undecodable", "release"]
"""What SETTLE does with one delivery: remove it (ack), make it visible again after a delay (nack),
move its payload to the dead-letter list (dead: reason nacked; undecodable: reason undecodable), or
undo it as if never received (release)."""

# Settles per SETTLE call: a bounded script run (each settle is one or two O(log N) zset writes).
MAX_SETTLES_PER_CALL = 500
# Added to a call's bound to tell SETTLE how long a resend may come after its first attempt: the
# server's clock and this process's measure the bound from slightly different instants.
_CLOCK_SLACK_MS = 1000


@dataclass(eq=False)
class Settle:
    """One settle: ``mode`` of the delivery ``element`` whose visibility deadline is
    ``deadline_ms`` (server ms); ``delay_ms`` for a nack."""

    element: bytes
    mode: SettleMode
    deadline_ms: int
    delay_ms: int = 0
    future: asyncio.Future[int] | None = None  # None: written behind


class Settler:
    """Sends the settles of one queue, many per round trip (see the module docstring)."""

    def __init__(self, scripts: QueueScripts, tasks: TaskOwner, *, max_deliveries: int | None,
                 events: Events) -> None:
        # Settles are durable writes (the queue's durability). A resend after a lost reply may find
        # its first try applied and write nothing, so its WAIT can come back before that first try
        # reached the replicas: an ack lost that way in a failover brings a duplicate, never a loss.
        self._scripts, self._keys, self._events, self._tasks = scripts, scripts.keys, events, tasks
        # The queue's limit (None: none), and the same as RECEIVE and SETTLE take it (0: none).
        self.max_deliveries, self.limit_arg = max_deliveries, max_deliveries or 0
        self._call_timeout_s = scripts.call_timeout_s
        # With durable writes an ack is confirmed by default (its caller waits for the replicas, as
        # for any other durable write); written behind only when asked (``ack(confirm=False)``).
        self.acks_confirmed = scripts.durability.enabled
        self._pending: list[Settle] = []
        self._loop = asyncio.get_running_loop()  # made by an open queue, in its loop
        self._flusher: asyncio.Future[None] | None = None
        self.closed = False
        # Called with the delay (ms) of each nack that landed: the consumer wakes its waiting
        # receivers then, instead of at their next recheck (up to safety_poll_s late).
        self.on_nacked: Callable[[int], None] | None = None
        # Called after a SETTLE call that released messages (prefetched, nobody came for them):
        # they are visible again, and a receiver that asked Redis before they landed (and found
        # nothing) is waiting for a wake-up, which would otherwise come at its recheck (safety_poll_s).
        self.on_released: Callable[[], None] | None = None

    def __repr__(self) -> str:
        return (f"<Settler {self._keys.destination!r} pending={len(self._pending)} "
                f"flushing={self._flusher is not None}>")

    @property
    def idle(self) -> bool:
        """Nothing waits to be sent and no call is in flight."""
        return self._flusher is None

    def ack_behind(self, element: bytes, deadline_ms: int, expires: float) -> bool:
        """Write an ack behind if it may be: the queue is open and more than ``call_timeout_s`` is
        left of the delivery, whose deadline is ``expires`` (loop time), the bound of the call that
        carries it, so it lands before the deadline unless Redis cannot be reached. Whether it did.
        (One call per ack: a worker acks at the rate of an ``async for``, and each layer shows.)"""
        if self.closed or expires - self._loop.time() <= self._call_timeout_s:
            return False
        self._pending.append(Settle(element, "ack", deadline_ms))
        if self._flusher is None:
            self._flusher = self._tasks.spawn(self._flush(), name="aiodelayq-settle")
        return True

    async def confirmed(self, settle: Settle) -> int:
        """Send ``settle`` with the next call and return the script's answer for it (1, 2 or 0, see
        SETTLE). The call is not cut off half-way when the caller leaves: it completes, bounded.

        Raises:
            BackendError: the call failed within ``call_timeout_s`` (``maybe_applied`` as usual).
        """
        settle.future = asyncio.get_running_loop().create_future()
        self._submit([settle])
        result = await asyncio.shield(settle.future)
        if result and settle.mode == "nack" and self.on_nacked is not None:
            self.on_nacked(settle.delay_ms)
        return result

    async def extend(self, element: bytes, vt_ms: int) -> int | None:
        """Move the visibility deadline of the delivery ``element`` to now + ``vt_ms`` (server
        clock); the new deadline (ms), or ``None`` when it is no longer in flight as this delivery.
        Resent after a lost reply (harmless: a little later deadline).

        Raises:
            BackendError: the call failed within ``call_timeout_s``.
        """
        reply = await self._scripts.extend.resend(element, vt_ms)
        return None if reply is None else int(reply)

    def behind(self, settles: Sequence[Settle]) -> None:
        """Send ``settles`` with the next call; nobody waits for them (see the module docstring)."""
        self._submit(settles)

    def _submit(self, settles: Sequence[Settle]) -> None:
        self._pending.extend(settles)
        if self._flusher is None:
            self._flusher = self._tasks.spawn(self._flush(), name="aiodelayq-settle")

    async def _flush(self) -> None:
        try:
            while self._pending:
                batch = self._pending[:MAX_SETTLES_PER_CALL]
                del self._pending[:MAX_SETTLES_PER_CALL]
                await self._send(batch)
        finally:
            self._flusher = None
            left, self._pending = self._pending, []
            self._give_up(left, BackendError(f"settle on {self._keys.destination!r} not sent: cancelled"))

    async def _send(self, batch: list[Settle]) -> None:
        k = self._keys
        body: list[Any] = []
        for s in batch:
            body += [s.element, s.mode, s.delay_ms, s.deadline_ms]

        # A resend says so: the script then tells "my first try applied it" per message, by its
        # deadline, or by the call id when a resend may come after one (within the call's bound).
        call_id, resend_ms = os.urandom(16), int(self._call_timeout_s * 1000) + _CLOCK_SLACK_MS

        async def attempt(remaining_s: float, resend: bool) -> Any:
            return await self._scripts.settle.durable(self.limit_arg, call_id, "1" if resend else "", resend_ms, *body,
                                                      timeout_s=remaining_s)

        try:
            self._events.count("settle_calls")
            results = await resend_within(attempt, timeout_s=self._call_timeout_s)
        except BaseException as exc:
            self._give_up(batch, exc)
            if not isinstance(exc, BackendError):
                raise  # cancelled (close deadline, forced shutdown): the finally gives up the rest
            return
        _report(self._events, batch, results)
        superseded, released = 0, False
        for s, result in zip(batch, results, strict=True):
            if s.mode == "release" and int(result) == 1:
                released = True
            if s.future is not None:
                if int(result) == 2:
                    # Per message: counted (stats.exhausted), visible in the dead-letter list, DEBUG.
                    self._events.count("exhausted")
                    log.debug("a message of %r was nacked on its last allowed delivery "
                              "(max_deliveries=%s); moved to dead-letter list %r", k.destination,
                              self.max_deliveries, k.dead_letter)
                if not s.future.done():
                    s.future.set_result(int(result))
            elif int(result) == 0 and s.mode == "ack":
                superseded += 1
        if released and self.on_released is not None:
            self.on_released()
        if superseded:
            self._events.count("unconfirmed_settles", superseded)
            log.warning("%d ack(s) on %r arrived after the visibility timeout and the message(s) had "
                        "been delivered again", superseded, k.destination)

    def _give_up(self, settles: list[Settle], exc: BaseException) -> None:
        behind = 0
        for s in settles:
            if s.future is None:
                behind += 1
            elif not s.future.done():
                s.future.set_exception(exc if isinstance(exc, BackendError) else
                                       BackendError(f"{s.mode} on {self._keys.destination!r} not confirmed: "
                                                    "the queue was closing", maybe_applied=True))
                s.future.exception()  # retrieved: its caller may have left
        if behind:
            self._events.count("unconfirmed_settles", behind)
            log.warning("%d settle(s) on %r not confirmed (%s); unless they landed, their messages are "
                        "delivered again after their visibility timeout", behind, self._keys.destination,
                        exc if isinstance(exc, BackendError) else "cancelled")

    async def aclose(self, deadline: float) -> None:
        """Send what is pending until ``deadline`` (loop time). A call still in flight then is
        stopped by the queue's task owner (its written-behind settles are counted as unconfirmed).
        Later settles wait for their answer."""
        self.closed = True
        flusher = self._flusher
        if flusher is not None:
            await asyncio.wait({flusher}, timeout=max(0.0, deadline - asyncio.get_running_loop().time()))


# SETTLE modes that write a dead letter when applied (result 1), and the reason they write.
_DEAD_REASONS = {"dead": "nacked", "undecodable": "undecodable"}


def _report(events: Events, batch: list[Settle], results: list[Any]) -> None:
    """The events of one SETTLE call: what it applied (result 1, or 2: a nack of a last delivery
    that dead-lettered it), counted per call."""
    acked = nacked = exhausted = 0
    dead: dict[str, int] = {}
    for settle, result in zip(batch, results, strict=True):
        applied = int(result)
        if not applied:
            continue
        mode = settle.mode
        if mode == "ack":
            acked += 1
        elif mode == "nack":
            nacked += 1
            exhausted += applied == 2
        elif mode in _DEAD_REASONS:
            nacked += mode == "dead"
            reason = _DEAD_REASONS[mode]
            dead[reason] = dead.get(reason, 0) + 1
    if acked:
        events.acked(acked)
    if nacked:
        events.nacked(nacked)
    if exhausted:
        dead["max_deliveries"] = exhausted
    for reason, n in dead.items():
        events.dead_lettered(n, reason)
