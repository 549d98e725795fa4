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


class _Run:
    """Settles of one mode, delay and deadline, sent as one run of SETTLE's arguments: a confirmed
    settle alone (its ``future``), written-behind ones together (a consumer's acks of one receive)."""

    __slots__ = ("deadline_ms", "delay_ms", "elements", "future", "landed", "mode", "resent")

    def __init__(self, mode: SettleMode, delay_ms: int, deadline_ms: int, elements: list[bytes],
                 future: asyncio.Future[int] | None = None) -> None:
        self.mode, self.delay_ms, self.deadline_ms = mode, delay_ms, deadline_ms
        self.elements, self.future = elements, future
        self.resent = False  # sent before (by a RECEIVE that failed): it may have been applied
        self.landed: asyncio.Future[None] | None = None  # done once the call that sends its last part ended

    def split(self, count: int) -> _Run:
        """The first ``count`` settles as a run of their own; this run keeps the rest."""
        head, self.elements = self.elements[:count], self.elements[count:]
        run = _Run(self.mode, self.delay_ms, self.deadline_ms, head, self.future)
        run.resent = self.resent
        return run

    @property
    def behind_acks(self) -> bool:
        """Acks written behind: nobody waits for them."""
        return self.future is None and self.mode == "ack"


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
        self._pending: list[_Run] = []
        self._acks: _Run | None = None  # the run written-behind acks of one deadline join
        self._loop = asyncio.get_running_loop()  # made by an open queue, in its loop
        self._flusher: asyncio.Future[None] | None = None
        self.closed = False
        # Wake receivers after a landed nack's delay (ms), not at their recheck.
        self.on_nacked: Callable[[int], None] | None = None
        # A SETTLE made room for receivers that found nothing (a group's item admitted, room under the
        # concurrency limit, a release): they look again now, not after its published wake-up.
        self.on_room: Callable[[], None] | None = None
        # A RECEIVE in flight that sends the next as it lands (see take_acks), or None.
        self.ride: Callable[[], asyncio.Future[Any] | None] = lambda: None

    def __repr__(self) -> str:
        return (f"<Settler {self._keys.destination!r} pending={sum(len(r.elements) for r in self._pending)} "
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
        run = self._acks
        if run is not None and run.deadline_ms == deadline_ms:
            run.elements.append(element)
        else:
            self._acks = run = _Run("ack", 0, deadline_ms, [element])
            self._pending.append(run)
        if self._flusher is None:  # (_flush_soon's test: most acks find the flusher running)
            self._flush_soon()
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

    def returned(self, settles: Sequence[Settle]) -> asyncio.Future[None]:
        """:meth:`behind`, and a future done once the call that sends the last of them ended (applied
        or not: a failure is reported as for any settle written behind)."""
        self._submit(settles)
        run = self._pending[-1]
        if run.landed is None:
            run.landed = self._loop.create_future()
        return run.landed

    def _submit(self, settles: Sequence[Settle]) -> None:
        pending = self._pending
        for s in settles:
            last = pending[-1] if pending else None
            if (s.future is None and last is not None and last.future is None and last.mode == s.mode
                    and last.deadline_ms == s.deadline_ms and last.delay_ms == s.delay_ms):
                last.elements.append(s.element)
            else:
                pending.append(_Run(s.mode, s.delay_ms, s.deadline_ms, [s.element], s.future))
        self._acks = None  # later acks go after these
        self._flush_soon()

    def take_acks(self) -> list[_Run]:
        """The written-behind acks waiting to be sent (up to MAX_SETTLES_PER_CALL), taken by a RECEIVE
        that carries them; it reports with :meth:`carried` or :meth:`not_carried`."""
        return self._take(lambda run: run.behind_acks)

    def _take(self, which: Callable[[_Run], bool]) -> list[_Run]:
        """The oldest pending runs ``which`` accepts, up to MAX_SETTLES_PER_CALL settles (a longer run
        is split: the rest stays in its place, and may take more acks)."""
        taken: list[_Run] = []
        room, kept = MAX_SETTLES_PER_CALL, []
        for run in self._pending:
            if not room or not which(run):
                kept.append(run)
            elif len(run.elements) > room:
                taken.append(run.split(room))
                kept.append(run)
                room = 0
            else:
                taken.append(run)
                room -= len(run.elements)
                if run is self._acks:
                    self._acks = None
        if taken:
            self._pending = kept
        return taken

    def carried(self, runs: list[_Run], acked: int) -> None:
        """A RECEIVE applied ``acked`` of the acks in ``runs`` (-1: a resend, whose first run applied
        them); the others' messages had been delivered again."""
        count = sum(len(r.elements) for r in runs)
        acked = count if acked < 0 else acked
        if acked:
            self._events.acked(acked)
        self._superseded(count - acked)

    def not_carried(self, runs: list[_Run], maybe_applied: bool) -> None:
        """The RECEIVE that carried ``runs`` failed: they go first with the next SETTLE call, which
        counts them as applied where their messages are gone before their deadline."""
        for run in runs:
            run.resent = run.resent or maybe_applied
        self._pending[:0] = runs
        self._flush_soon()

    def _superseded(self, count: int) -> None:
        if count:
            self._events.count("unconfirmed_settles", count)
            log.warning("%d ack(s) on %r arrived after the visibility timeout and the message(s) had "
                        "been delivered again", count, self._keys.destination)

    def _flush_soon(self) -> None:
        """Start the flush task unless it runs: it sends what is pending, call after call."""
        if self._flusher is None:
            self._flusher = self._tasks.spawn(self._flush(), name="aiodelayq-settle")

    async def _flush(self) -> None:
        try:
            while self._pending:
                if all(run.behind_acks for run in self._pending) and (ride := self.ride()) is not None:
                    await asyncio.wait({ride})  # the RECEIVE it sends as it lands carries them
                    continue
                batch = self._take(lambda _run: True)
                try:
                    await self._send(batch)
                finally:
                    _landed(batch)
        finally:
            self._flusher, self._acks = None, None
            left, self._pending = self._pending, []
            self._give_up(left, BackendError(f"settle on {self._keys.destination!r} not sent: cancelled"))
            _landed(left)

    async def _send(self, batch: list[_Run]) -> None:
        k = self._keys
        body: list[Any] = []
        for r in batch:
            body += (r.mode, r.delay_ms, r.deadline_ms, len(r.elements))
            body += r.elements

        # A resend says so, so the script can tell its own first try by deadline or call id.
        call_id, resend_ms = os.urandom(16), int(self._call_timeout_s * 1000) + _CLOCK_SLACK_MS

        resent = any(r.resent for r in batch)

        async def attempt(remaining_s: float, resend: bool) -> Any:
            return await self._scripts.settle.durable(self.limit_arg, call_id, "1" if resend or resent else "",
                                                      resend_ms, *body, timeout_s=remaining_s)

        try:
            self._events.count("settle_calls")
            results = await resend_within(attempt, timeout_s=self._call_timeout_s)
        except BaseException as exc:
            self._give_up(batch, exc)
            if not isinstance(exc, BackendError):
                raise  # cancelled (close deadline, forced shutdown): the finally gives up the rest
            return
        settles = len(body) - 4 * len(batch)  # each run's 4 arguments, then its elements
        if len(results) != settles + 1:  # one per settle and the room flag, else the replies are not SETTLE's
            wrong = BackendError(f"SETTLE on {k.destination!r} answered {len(results) - 1} results for "
                                 f"{settles} settles", maybe_applied=True)
            self._give_up(batch, wrong)
            return
        answers, at = [], 0  # each run's results
        for r in batch:
            answers.append([int(result) for result in results[at:at + len(r.elements)]])
            at += len(r.elements)
        _report(self._events, batch, answers)
        superseded, room = 0, results[-1] == 1
        for r, got in zip(batch, answers, strict=True):
            if r.future is not None:
                result = got[0]
                if result == 2:
                    # Per message: counted (stats.exhausted), visible in the dead-letter list, DEBUG.
                    self._events.count("exhausted")
                    log.debug("a message of %r was nacked on its last allowed delivery "
                              "(max_deliveries=%s); moved to dead-letter list %r", k.destination,
                              self.max_deliveries, k.dead_letter)
                if not r.future.done():
                    r.future.set_result(result)
            elif r.mode == "ack":
                superseded += got.count(0)
        if room and self.on_room is not None:
            self.on_room()
        self._superseded(superseded)

    def _give_up(self, runs: list[_Run], exc: BaseException) -> None:
        behind = 0
        for r in runs:
            if r.future is None:
                behind += len(r.elements)
            elif not r.future.done():
                r.future.set_exception(exc if isinstance(exc, BackendError) else
                                       BackendError(f"{r.mode} on {self._keys.destination!r} not confirmed: "
                                                    "the queue was closing", maybe_applied=True))
                r.future.exception()  # retrieved: its caller may have left
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


def _report(events: Events, batch: list[_Run], answers: list[list[int]]) -> None:
    """The events of one SETTLE call, from each run's results (2: a nack that dead-lettered a last
    delivery)."""
    acked = nacked = exhausted = 0
    dead: dict[str, int] = {}
    for r, got in zip(batch, answers, strict=True):
        applied = len(got) - got.count(0)
        if not applied:
            continue
        mode = r.mode
        if mode == "ack":
            acked += applied
        elif mode == "nack":
            nacked += applied
            exhausted += got.count(2)
        elif mode in _DEAD_REASONS:
            nacked += applied if mode == "dead" else 0
            reason = _DEAD_REASONS[mode]
            dead[reason] = dead.get(reason, 0) + applied
    if acked:
        events.acked(acked)
    if nacked:
        events.nacked(nacked)
    if exhausted:
        dead["max_deliveries"] = exhausted
    for reason, n in dead.items():
        events.dead_lettered(n, reason)


def _landed(runs: list[_Run]) -> None:
    """The call that carried ``runs`` ended, or they will not be sent: their :meth:`Settler.returned`
    futures are done."""
    for run in runs:
        if run.landed is not None and not run.landed.done():
            run.landed.set_result(None)
