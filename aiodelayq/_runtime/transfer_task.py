"""The transfer task: one per queue, client and event loop; moves due items with ``loop.call_at``."""

from __future__ import annotations

import asyncio
import logging
import math
import random
from dataclasses import dataclass, field
from typing import Any

from .._redis.backoff import Backoff
from .._redis.connections import is_permanent
from .._scripts import QueueScripts
from .._scripts.foreign_keys import refusal_advice
from .._util.clock import reached
from .._util.observe import Events, transfer_limit
from .._util.tasks import TaskOwner, wait_event
from .._wire.key_names import QueueKeys
from ..exceptions import BackendError, ShardCountError
from .consumers import QueueConsumers

__all__ = ["TransferStats", "TransferTask"]

log = logging.getLogger("aiodelayq")

# Least delay before the next timed transfer after one that moved nothing because others did.
_AFTER_EMPTY_S = 0.002
# A due-time timer is armed this much early: asyncio timers fire up to 1 ms late (whole-ms
# epoll/libuv timeouts). A transfer that comes too early is retried at the due time, without _AFTER_EMPTY_S.
_TIMER_LEAD_S = 0.0005
# While a backlog drains and the consumers' POPs move it (see TransferTask._stand_aside): the longest
# this task waits for the next such POP before it transfers itself (a POP's round trip is 1-5 ms).
_STAND_ASIDE_S = 0.05


@dataclass
class TransferStats:
    """Counters of one transfer task (this process only): a snapshot of its events.

    Attributes:
        transfers: transfer script calls that succeeded.
        moved: items moved to the destination list.
        dead_lettered: malformed elements moved to the dead-letter list.
        errors: transfer calls that failed (each retried with backoff).
        recovered: popped items whose consumer did not finish with them within the hand-off lease,
            returned to the head of the destination by this process's transfers.
        last_error: the latest failure, if any.
    """

    transfers: int = 0
    moved: int = 0
    dead_lettered: int = 0
    errors: int = 0
    recovered: int = 0
    last_error: str | None = field(default=None)


class TransferTask:
    """Runs the transfer script when the earliest pending item falls due (Redisson's
    ``QueueTransferTask``).

    Due times are **Redis server** epoch ms, timers ``loop.time()``; each reply's ``TIME`` (taken at
    the round trip's midpoint) anchors one to the other, so clock skew does not move delivery.
    Wake-ups: a subscribe confirmation, a published due time, the "next due" reply, the earliest
    hand-off lease and the safety poll. A wake-up never replaces an earlier one. After a failure
    every wake-up but a resubscribe waits for the backoff's pause (``_redis/backoff.py``), so a
    refusal the server repeats is retried at that pace whoever asks.
    """

    def __init__(self, scripts: QueueScripts, tasks: TaskOwner, *, batch: int, safety_poll_s: float,
                 slots: asyncio.Semaphore, shared_poll: bool = False, lag_warning_s: float | None = None) -> None:
        self._scripts = scripts
        self._keys = keys = scripts.keys
        self._batch = batch
        self._safety_poll_s = safety_poll_s
        # The watchdog: a look that finds items due this long ago logs a WARNING (None: never).
        self._lag_warning_s = lag_warning_s
        self._lagging = False
        # The earliest pending due time seen (server ms), for the lag while transfers fail.
        self._head_ms: float | None = None
        self._call_timeout_s = scripts.call_timeout_s
        # Shared by the client's transfer tasks: caps pooled connections when many queues wake at once.
        self._slots = slots
        self._loop = asyncio.get_running_loop()
        # Else (a cluster) this task arms its own safety timer.
        self._shared_poll = shared_poll
        self.poll_at = self._loop.time() + safety_poll_s
        self._wake = asyncio.Event()
        self._transferred = asyncio.Event()
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = math.inf
        # (loop.time(), server epoch ms) measured at the same instant.
        self._anchor: tuple[float, float] | None = None
        # The due time (server ms) the latest due-time timer was armed for (see _TIMER_LEAD_S).
        self._aimed_ms: float | None = None
        # The last transfer moved a full batch: a backlog drains. The consumers' POPs top up meanwhile
        # (see _set_backlog), and this task transfers back to back unless they keep the list empty.
        self._backlog = False
        # While it drains: (loop time, what it moved) of the last consumer's POP that moved items and
        # left the list empty (None: it moved nothing, the list held all it wanted), and a wake-up per
        # consumer's POP that topped up (see _stand_aside).
        self._pops_drain: tuple[float, tuple[int, int, float | None, float | None] | None] | None = None
        self._pop_reported = asyncio.Event()
        self._task = tasks.supervise(f"aiodelayq-transfer:{keys.destination}", self._run, restart_after_s=1.0,
                                    on_crash=self._crashed)
        self._permanent: BackendError | ShardCountError | None = None
        # Until a transfer succeeds, open() reports the failures, so they are logged at DEBUG.
        self._opened = False
        self._backoff = Backoff(f"transfer for {keys.destination!r}")
        self._retry_at = 0.0
        self._resubscribed = False
        self.events = Events(keys.destination)
        self._last_error: str | None = None
        self._consumers: list[QueueConsumers] = []

    @property
    def stats(self) -> TransferStats:
        """A snapshot of this transfer task's counters."""
        counts = self.events.counts
        return TransferStats(transfers=counts["transfers"], moved=counts["moved"],
                              dead_lettered=counts["dead_lettered:malformed"], errors=counts["transfer_errors"],
                              recovered=counts["recovered"], last_error=self._last_error)

    @property
    def safety_poll_s(self) -> float:
        """The longest the queue goes without being looked at while open (seconds)."""
        return self._safety_poll_s

    @property
    def keys(self) -> QueueKeys:
        """The Redis keys of the queue."""
        return self._keys

    @property
    def slots(self) -> asyncio.Semaphore:
        """The client's shared limit on concurrent background calls."""
        return self._slots

    def __repr__(self) -> str:
        return (f"<TransferTask {self._keys.destination!r} transfers={self.stats.transfers} "
                f"armed_at={self._timer_at:.3f} task={self._task!r}>")

    @property
    def armed_at(self) -> float:
        """Loop time of the next timed wake-up (``inf`` when none)."""
        return self._timer_at

    def attach(self, consumers: QueueConsumers) -> None:
        """Tell ``consumers`` (an open queue object's) what each transfer does, until :meth:`detach`."""
        self._consumers.append(consumers)

    def detach(self, consumers: QueueConsumers) -> None:
        """Stop telling ``consumers`` (idempotent)."""
        if consumers in self._consumers:
            self._consumers.remove(consumers)
            consumers.transfer_in_pops(0, self._took)

    def _set_backlog(self, backlog: bool) -> None:
        """While a backlog drains, the consumers' POPs top up (they move the items they pop) and
        report what they moved here (told again per batch: a pump stops by itself once a POP finds
        nothing more due)."""
        if backlog or self._backlog:
            limit = transfer_limit(self._batch) if backlog else 0
            for consumers in list(self._consumers):
                consumers.transfer_in_pops(limit, self._popped)
        self._backlog = backlog

    def _popped(self, sent: float, received: float, reply: Any) -> None:
        """A consumer's POP topped up while a backlog drains: accounted as this task's transfer; noted
        when it moved items and left the list empty, or found all it wanted in the list (``reply``
        ``None``: it moved nothing), see :meth:`_stand_aside`."""
        if reply is None:
            self._pops_drain = (received, None)
        else:
            took = self._took(sent, received, reply)
            self._pops_drain = (received, took) if took[0] and not int(reply[7]) else None
        self._pop_reported.set()

    async def _stand_aside(self) -> tuple[int, int, float | None, float | None] | None:
        """While a backlog drains and the consumers' POPs top up (they pop the list, then move what
        they still want, which skips the list), a transfer of this task's would fill the list and put
        the hop back. Wait for the next such POP instead (at most _STAND_ASIDE_S) and return what it
        moved; ``None``: transfer now (no such POP lately or out, one that left the list holding
        items it moved, or a reliable receiver waits for the list)."""
        last, consumers = self._pops_drain, self._consumers
        lately = last is not None and self._loop.time() - last[0] <= _STAND_ASIDE_S
        if not (lately or any(c.pump.topping_up for c in consumers)) or any(c.reliable.waiting for c in consumers):
            return None
        self._pop_reported.clear()
        if not await wait_event(self._pop_reported, _STAND_ASIDE_S) or self._pops_drain is None:
            return None
        # A POP that found all it wanted in the list moved nothing: the backlog is as last seen.
        return self._pops_drain[1] or (0, 0, self._head_ms, None)

    def start(self) -> None:
        """Start the worker task; the first transfer runs at once."""
        self._task.start()
        self._wake.set()

    def _crashed(self, exc: BaseException) -> None:
        # A bug in the worker: counted like a failed transfer; the restarted worker transfers at once.
        self._last_error = repr(exc)
        self.events.transfer_error()
        self._wake.set()

    async def wait_transferred(self, timeout_s: float) -> bool:
        """Wait until one transfer has succeeded since start; return whether it did within the bound.

        Raises:
            AccessDeniedError, WrongNodeError, ShardCountError: the transfer failed with a permanent
                error (a ShardCountError: an ordinary queue object on a sharded queue's name).
        """
        await wait_event(self._transferred, timeout_s)
        if not self._transferred.is_set() and self._permanent is not None:
            raise self._permanent
        return self._transferred.is_set()

    async def aclose(self, timeout_s: float) -> None:
        """Cancel the timer and stop the worker (idempotent)."""
        self._cancel_timer()
        await self._task.stop(timeout_s)

    # -- wake-up sources -------------------------------------------------------------------------

    def on_subscribed(self) -> None:
        """Channel (re)subscribed: transfer now, as the queue may have fallen due while unheard (the
        server answers again: this wake-up does not wait for a backoff's pause)."""
        self._resubscribed = True
        self._wake.set()

    def room(self) -> None:
        """Consumers that found nothing may find something now, and nothing fell due (a group's item admitted,
        room under the concurrency limit, items back at a list's head, a control changed): every
        consumer attached here looks again, without a transfer. A settle in this process calls it
        as its reply lands; the subscriber, for such a wake-up published by any process."""
        for consumers in list(self._consumers):
            consumers.room()

    def wake(self) -> None:
        """Transfer now."""
        self._wake.set()

    def polled(self, anchor: tuple[float, float], head_ms: float | None, lease_ms: float | None, ready: int) -> None:
        """The client's safety poll read the queue (``anchor``: ``(loop time, server epoch ms)``;
        ``head_ms``/``lease_ms``: next wake-up and lease deadline or ``None``; ``ready``: the
        destination's length): transfer if due, else aim at what comes next; wake consumers if ready."""
        self._anchor = anchor
        self.poll_at = self._loop.time() + self._safety_poll_s * random.uniform(0.8, 1.0)
        now_ms = anchor[1]
        self._head_ms = head_ms
        self._watch_lag(0.0 if head_ms is None else now_ms - head_ms)
        if (head_ms is not None and head_ms <= now_ms) or (lease_ms is not None and lease_ms <= now_ms):
            self._wake.set()
            return
        if head_ms is not None:
            self.on_due(int(head_ms))
        if lease_ms is not None:
            self.arm_at(self._server_ms_to_loop(lease_ms) + 0.001)
        if ready > 0:
            for consumers in list(self._consumers):
                consumers.transferred(ready)

    def poll_refused(self) -> None:
        """The safety poll's read was refused: transfer (at the backoff's pace), whose error names the key."""
        self.poll_at = self._loop.time() + self._safety_poll_s * random.uniform(0.8, 1.0)
        self._wake.set()

    def _watch_lag(self, lag_ms: float) -> None:
        """One WARNING when the lag reaches ``lag_warning_s``; one INFO when back under half."""
        limit_s = self._lag_warning_s
        if limit_s is None:
            return
        if lag_ms >= limit_s * 1000:
            if not self._lagging:
                self._lagging = True
                log.warning("items of %r fell due %.1f s ago and are not moved yet (lag_warning_s=%g); %s",
                            self._keys.destination, lag_ms / 1000, limit_s,
                            f"last transfer error: {self._last_error}" if self._backoff.failures else
                            "transfers run but fall behind, or none runs")
        elif self._lagging and lag_ms < limit_s * 500:
            self._lagging = False
            log.info("the lag of %r is back to %.1f s", self._keys.destination, lag_ms / 1000)

    def on_due(self, due_ms: int | None) -> None:
        """A producer published a new earliest due time (epoch ms, server clock)."""
        if due_ms is not None and (self._head_ms is None or due_ms < self._head_ms):
            self._head_ms = due_ms
        if due_ms is None or self._anchor is None:
            self._wake.set()
        else:
            when = self._server_ms_to_loop(due_ms) - _TIMER_LEAD_S
            if when < self._timer_at:  # only an earlier due time is aimed at (arm_at keeps the earlier)
                self._aimed_ms = due_ms
                self.arm_at(when)

    def arm_at(self, when: float) -> None:
        """Wake at loop time ``when`` unless a wake-up at or before it is already armed."""
        if reached(self._loop.time(), when):
            self._wake.set()
            return
        if self._timer is not None:
            if self._timer_at <= when:
                return
            self._timer.cancel()
        self._timer_at = when
        self._timer = self._loop.call_at(when, self._fire)

    def _fire(self) -> None:
        self._timer = None
        self._timer_at = math.inf
        self._wake.set()

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
            self._timer_at = math.inf

    def _server_ms_to_loop(self, due_ms: float) -> float:
        assert self._anchor is not None
        anchor_loop, anchor_ms = self._anchor
        return anchor_loop + (due_ms - anchor_ms) / 1000.0

    # -- the worker ------------------------------------------------------------------------------

    async def _run(self) -> None:
        backoff = self._backoff
        while True:
            await self._wake.wait()
            self._wake.clear()
            if not reached(self._loop.time(), self._retry_at) and not self._resubscribed:
                self.arm_at(self._retry_at)  # after a failure, a wake-up waits for the backoff's pause
                continue
            self._resubscribed = False
            try:
                reply = await self._transfer()
            except (BackendError, ShardCountError) as exc:
                self._last_error = str(exc)
                self.events.transfer_error()
                if is_permanent(exc):
                    self._permanent = exc
                    self._transferred.set()  # wakes open(), which raises it
                    self._transferred.clear()
                self._set_backlog(False)
                delay = backoff.count()
                self._retry_at = self._loop.time() + delay
                due = self._opened and backoff.level(exc) >= logging.ERROR
                advice = await refusal_advice(self._scripts, exc) if due else ""
                backoff.report(exc, delay, advice=advice, quiet=not self._opened)
                if self._anchor is not None and self._head_ms is not None:  # how late it is by now
                    self._watch_lag(self._anchor[1] + (self._loop.time() - self._anchor[0]) * 1000 - self._head_ms)
                self.arm_at(self._retry_at)
                continue
            self._retry_at = 0.0
            backoff.succeeded()
            self._opened = True
            moved, dead, next_due, lease_due = reply
            self._head_ms = next_due
            if lease_due is not None:
                self.arm_at(self._server_ms_to_loop(lease_due) + 0.001)
            assert self._anchor is not None
            # A full batch, or a next wake-up already due (a tier bucket to promote), left work behind.
            full = moved + dead >= self._batch or (next_due is not None and next_due <= int(self._anchor[1]))
            self._set_backlog(full)
            self._watch_lag(self._anchor[1] - next_due if full and next_due is not None else 0.0)
            if full:
                self._wake.set()  # more may be due: go again without waiting
                continue
            # Jittered so that many queues opened together do not poll in lockstep.
            self.poll_at = self._loop.time() + self._safety_poll_s * random.uniform(0.8, 1.0)
            when = math.inf if self._shared_poll else self.poll_at
            if next_due is not None:
                due_at = self._server_ms_to_loop(next_due)
                if moved + dead > 0:
                    due_at -= _TIMER_LEAD_S
                elif next_due != self._aimed_ms:
                    # Another process moved them: never spin, and let the others win the race briefly.
                    due_at = max(due_at, self._loop.time() + _AFTER_EMPTY_S)
                # else: too early for the item aimed at: retry at its due time, without the lead.
                self._aimed_ms = next_due
                when = min(when, due_at)
            if when < math.inf:
                self.arm_at(when)

    async def _transfer(self) -> tuple[int, int, float | None, float | None]:
        if self._backlog and (moved_by_pops := await self._stand_aside()) is not None:
            return moved_by_pops  # accounted as it came (_popped)
        limit = transfer_limit(self._batch)  # negative (lateness measured) only with a sink
        delegated = None if self._backlog else await self._delegate(limit)
        if delegated is not None:
            sent, received, reply = delegated
        else:
            async with self._slots:
                sent = self._loop.time()
                reply = await self._scripts.transfer(limit, what=f"transfer of {self._keys.destination!r}")
                received = self._loop.time()
        return self._took(sent, received, reply)

    def _took(self, sent: float, received: float, reply: Any) -> tuple[int, int, float | None, float | None]:
        """Account for one transfer's ``reply`` (this task's, or a consumer's POP's), sent and received
        at those loop times: ``(moved, dead-lettered, next due ms, earliest lease deadline ms)``."""
        keys = self._keys
        # 8 entries, and a 9th (the lateness list) only when a negative limit asked for it.
        moved, dead, next_due, seconds, micros, recovered, lease_due, ready = reply[:8]
        self._anchor = ((sent + received) / 2, int(seconds) * 1000 + int(micros) / 1000)
        self.events.count("transfers")
        if moved or dead:
            _report(self.events, int(moved), int(dead), int(micros), reply[8] if len(reply) > 8 else None)
        if dead:
            log.error("moved %d malformed element(s) of %r to dead-letter list %r",
                      dead, keys.destination, keys.dead_letter)
        if recovered:
            self.events.count("recovered", int(recovered))
            log.warning("%d item(s) of %r popped by a consumer that did not finish within its lease "
                        "went back to the head of the queue", recovered, keys.destination)
        self._transferred.set()
        for consumers in list(self._consumers):
            consumers.transferred(int(ready))
        return (int(moved), int(dead), float(next_due) if next_due is not None else None,
                float(lease_due) if lease_due is not None else None)

    async def _delegate(self, limit: int) -> tuple[float, float, Any] | None:
        """Let a consumer with waiting callers transfer in its next POP: ``(sent, received, reply)`` or ``None``."""
        for consumers in list(self._consumers):
            future = consumers.transfer_in_pop(limit)
            if future is None:
                continue
            # The pump always answers; this bound only guards against a bug there.
            done, _ = await asyncio.wait({future}, timeout=self._call_timeout_s * 3)
            result: tuple[float, float, Any] | None = future.result() if done else None
            return result if result is not None and result[2] is not None else None
        return None


def _report(events: Events, moved: int, dead: int, micros: int, late: Any) -> None:
    """One transfer's events; ``late`` (whole ms, or ``None``) gets the ``TIME``'s sub-ms part added back."""
    if moved:
        frac_ms = (micros % 1000) / 1000
        events.moved(moved, [int(ms) + frac_ms for ms in late] if late else ())
    if dead:
        events.dead_lettered(dead, "malformed")
