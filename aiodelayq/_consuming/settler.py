"""Settles (ack, nack, dead, release) of one queue's messages, coalesced into SETTLE calls.

Settles that arrive while a call is in flight go out together in the next. A settle is *confirmed*
(its caller awaits the answer) or *written behind* (nobody waits); one of the latter that cannot be
confirmed is logged and counted, and its message is delivered again (at-least-once).
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

# Settles per SETTLE call: bounds the script's run time.
MAX_SETTLES_PER_CALL = 500
# Added to the resend window SETTLE is told: its clock and ours start the bound at different instants.
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
    """Sends the settles of one queue, many per round trip."""

    def __init__(self, scripts: QueueScripts, tasks: TaskOwner, *, max_deliveries: int | None,
                 events: Events) -> None:
        # A resend that finds its first try applied writes nothing, so its WAIT may return before
        # that try reached the replicas: a failover then brings a duplicate, never a loss.
        self._scripts, self._keys, self._events, self._tasks = scripts, scripts.keys, events, tasks
        self.max_deliveries, self.limit_arg = max_deliveries, max_deliveries or 0
        self._call_timeout_s = scripts.call_timeout_s
        self.acks_confirmed = scripts.durability.enabled
        self._pending: list[Settle] = []
        self._loop = asyncio.get_running_loop()  # made by an open queue, in its loop
        self._flusher: asyncio.Future[None] | None = None
        self.closed = False
        # Wake receivers after a landed nack's delay (ms) / a release, not at their recheck.
        self.on_nacked: Callable[[int], None] | None = None
        self.on_released: Callable[[], None] | None = None

    def __repr__(self) -> str:
        return (f"<Settler {self._keys.destination!r} pending={len(self._pending)} "
                f"flushing={self._flusher is not None}>")

    @property
    def idle(self) -> bool:
        """Nothing waits to be sent and no call is in flight."""
        return self._flusher is None

    def ack_behind(self, element: bytes, deadline_ms: int, expires: float) -> bool:
        """Write an ack behind if the queue is open and more than ``call_timeout_s`` (the call's bound)
        is left before ``expires`` (loop time), so it lands in time; whether it did."""
        if self.closed or expires - self._loop.time() <= self._call_timeout_s:
            return False
        self._pending.append(Settle(element, "ack", deadline_ms))
        if self._flusher is None:
            self._flusher = self._tasks.spawn(self._flush(), name="aiodelayq-settle")
        return True

    async def confirmed(self, settle: Settle) -> int:
        """Send ``settle`` with the next call; SETTLE's answer for it (1, 2 or 0). A leaving caller
        does not cut the call off.

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
        """Set ``element``'s deadline to now + ``vt_ms`` (server clock): the new deadline (ms), or
        ``None`` when no longer in flight as this delivery. Resent (harmless: a little later).

        Raises:
            BackendError: the call failed within ``call_timeout_s``.
        """
        reply = await self._scripts.extend.resend(element, vt_ms)
        return None if reply is None else int(reply)

    def behind(self, settles: Sequence[Settle]) -> None:
        """Send ``settles`` with the next call, written behind."""
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

        # A resend says so, so the script can tell its own first try by deadline or call id.
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
        """Send what is pending until ``deadline`` (loop time); the task owner stops the rest."""
        self.closed = True
        flusher = self._flusher
        if flusher is not None:
            await asyncio.wait({flusher}, timeout=max(0.0, deadline - asyncio.get_running_loop().time()))


# SETTLE modes that write a dead letter when applied (result 1), and the reason they write.
_DEAD_REASONS = {"dead": "nacked", "undecodable": "undecodable"}


def _report(events: Events, batch: list[Settle], results: list[Any]) -> None:
    """The events of one SETTLE call (result 2: a nack that dead-lettered a last delivery)."""
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
