"""Plain consuming (``take``/``take_many``/``poll``): one pump per open queue object pops due items for
the callers that wait, through a hand-off area in Redis, so nothing popped is ever lost.

Why no ``BLPOP``: a blocking pop pins one pooled connection per consumed queue (99 consumed queues
exhaust redis-py's default pool), cannot span cluster slots, and a stall longer than its read
timeout desynchronised the connection. The pump pops without blocking, when something says items
may be there: a waiter arrived, this process's scheduler ran a transfer (its own, or a no-op because
another process moved the items at the same due time), a returned item was announced on the
channel, or the last pop came back full. Pops share the client's few transfer slots, so a client's
connections do not grow with the number of queues.

Why a hand-off: POP moves items from the destination into ``aiodelayq_handoff:{N}`` under the pop's
call id, atomically, with a lease. The pump hands them to waiters; once every item of a pop is
settled (taken by a caller, given back, or dead-lettered) one FINISH removes the entry. A caller
cancelled between the pop and its wake-up gives its items to the next waiter or back to the head
of the list; a forced shutdown returns what it can within a short bound; whatever remains (a killed
process, a lost connection) goes back to the head of the destination when the lease ends (TRANSFER
does it, in any process that has the queue open).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from redis.asyncio import Redis

from ._connections import is_permanent, run_script
from ._keys import QueueKeys
from ._prefetch import Prefetch
from ._retry import Backoff, resend_within, retry_until_done
from ._scripts.take import FINISH, POP
from ._tasks import Supervised, keep, wait_through_cancellation
from .exceptions import BackendError, DecodeError

__all__ = ["HANDOFF_LEASE_MS", "TakePump"]

log = logging.getLogger("aiodelayq")

# How long popped items may stay in the hand-off before any opener returns them to the queue. A
# live pump finishes an entry within a round trip; a pump cut off for longer loses its claim.
HANDOFF_LEASE_MS = 20_000
# A pop whose reply was lost is resent with the same call id (which returns the same items) for at
# most this long; then it is given up with FINISH '*', and the lease covers the rest.
_RESEND_HORIZON_S = 10.0
# How long a forced shutdown (the pump task cancelled) spends returning popped items before it
# leaves them to the lease.
_SHUTDOWN_FLUSH_S = 0.5
# Prefetch (see _prefetch.py): items popped for nobody yet wait in a buffer at most one round trip.


@dataclass(eq=False)
class _Pop:
    """One POP call's items and what became of each (``plan``: ``d``/``x``/``r`` per item)."""

    call_id: bytes
    size: int = -1  # -1 until the reply is read: the outcome is unknown
    finish_attempts: int = 0
    plan: list[str | None] = field(default_factory=list)
    undecided: int = 0
    finishing: asyncio.Future[Any] | None = None

    def received(self, count: int) -> None:
        self.size = count
        self.plan = [None] * count
        self.undecided = count

    def settle(self, index: int, verdict: str) -> None:
        if self.plan[index] is None:
            self.undecided -= 1
        self.plan[index] = verdict

    @property
    def settled(self) -> bool:
        return self.size >= 0 and self.undecided == 0


@dataclass(eq=False)
class _Waiter:
    future: asyncio.Future[list[tuple[_Pop, int, Any]]]
    capacity: int
    once: bool  # poll without waiting: one pop attempt, then [] if nothing came


class TakePump:
    """Serves decoded items of one queue to waiters in FIFO order (see the module docstring)."""

    def __init__(self, client: Redis, keys: QueueKeys, *, decode: Callable[[bytes], Any],
                 slots: asyncio.Semaphore, call_timeout_s: float) -> None:
        self._client = client
        self._keys = keys
        self._decode = decode
        self._slots = slots
        self._call_timeout_s = call_timeout_s
        self._waiters: collections.deque[_Waiter] = collections.deque()
        self._wake = asyncio.Event()
        self._maybe_ready = True
        # Started by the first caller; restarted after a crash while callers wait.
        self._task = Supervised(f"aiodelayq-take:{keys.destination}", self._run, restart_after_s=0.1,
                                wanted=lambda: self._closed is None and bool(self._waiters),
                                on_crash=lambda _exc: self.notify())
        self._pops: set[_Pop] = set()  # popped and not yet finished in Redis
        # Prefetched items no caller has yet, in pop order; held at most one round trip.
        self._buffer: collections.deque[tuple[_Pop, int, Any]] = collections.deque()
        self._hold: asyncio.TimerHandle | None = None
        self._prefetch = Prefetch()
        # Pops whose every item was handed out: the next POP forgets them in its own call (one
        # round trip less per pop); if no POP comes within a round trip, FINISH does.
        self._done_pops: dict[_Pop, None] = {}
        self._done_timer: asyncio.TimerHandle | None = None
        # FINISHes that give items back to the list: a POP waits for them, so it cannot overtake
        # them and pop later items first (list order).
        self._returning: set[asyncio.Future[Any]] = set()
        self._closed: BaseException | None = None
        self._flush_deadline: float | None = None
        self.returned = 0
        self.undecodable = 0
        self.pops = 0  # POP calls that returned items

    def __repr__(self) -> str:
        return (f"<TakePump {self._keys.destination!r} waiters={len(self._waiters)} buffered={len(self._buffer)} "
                f"prefetch={self._prefetch.size} unfinished={len(self._pops)} closed={self._closed is not None} "
                f"task={self._task!r}>")

    # -- callers -----------------------------------------------------------------------------------

    async def get(self, timeout_s: float | None, max_items: int = 1, *, once: bool = False) -> list[Any]:
        """Up to ``max_items`` decoded items; waits up to ``timeout_s`` (``None``: forever) for at
        least one, ``[]`` after it. ``once``: a single pop attempt, no waiting.

        Raises:
            the exception given to :meth:`fail_waiters` once closing; a permanent
            :class:`BackendError` (e.g. missing permission) of the pop; and the caller's own
            ``asyncio.CancelledError``, without losing a popped item.
        """
        if self._closed is not None:
            raise self._closed
        if self._buffer and not self._waiters:
            return self._deliver(self._from_buffer(max_items))  # prefetched: no round trip, no await
        waiter = _Waiter(asyncio.get_running_loop().create_future(), max_items, once)
        self._waiters.append(waiter)
        self.notify()
        self._task.start()
        try:
            await asyncio.wait({waiter.future}, timeout=timeout_s)
        except asyncio.CancelledError:
            self._leave(waiter)
            raise
        if not waiter.future.done():
            self._leave(waiter)
            return []
        return self._deliver(waiter.future.result())  # raises fail_waiters' exception

    def _deliver(self, entries: list[tuple[_Pop, int, Any]]) -> list[Any]:
        """The caller has ``entries``: record them as taken; returns their values."""
        self._settle(entries, "d")
        return [value for _, _, value in entries]

    def _settle(self, entries: list[tuple[_Pop, int, Any]], verdict: str) -> None:
        """Record ``verdict`` for ``entries`` and finish the pops that are now settled."""
        for pop, index, _ in entries:
            pop.settle(index, verdict)
        for pop in {id(pop): pop for pop, _, _ in entries}.values():
            self._maybe_finish(pop)

    def _from_buffer(self, count: int) -> list[tuple[_Pop, int, Any]]:
        taken = [self._buffer.popleft() for _ in range(min(count, len(self._buffer)))]
        if not self._buffer:
            self._cancel_hold()
        return taken

    def _cancel_hold(self) -> None:
        if self._hold is not None:
            self._hold.cancel()
            self._hold = None

    def _give_back_buffer(self) -> None:
        """Prefetched items nobody came for within a round trip (or at close) go back to the list."""
        self._cancel_hold()  # a no-op when the hold timer itself called this
        if not self._buffer:
            return
        entries = list(self._buffer)
        self._buffer.clear()
        self._prefetch.gave_back()
        self._return(entries)

    def _return(self, entries: list[tuple[_Pop, int, Any]]) -> None:
        """Nobody takes ``entries``: back to the head of the list."""
        self.returned += len(entries)
        self._settle(entries, "r")

    def notify(self) -> None:
        """Items may be in the destination now: pop for the waiters."""
        self._maybe_ready = True
        self._wake.set()

    def fail_waiters(self, exc: BaseException) -> None:
        """Close for callers: wake every waiter with ``exc`` and raise it from later calls."""
        self._closed = exc
        self._wake.set()
        self._fail_current(exc)
        self._give_back_buffer()

    async def aclose(self, timeout_s: float) -> None:
        """Stop popping and settle everything popped (given back or finished), within ``timeout_s``;
        what is left then is returned to the queue by the hand-off lease."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        self._flush_deadline = deadline
        if self._closed is None:
            self.fail_waiters(ConnectionError("pump closed"))
        # A pop in flight is abandoned at once: the task's flush settles it (FINISH '*') within the
        # same deadline, so closing never waits for a stalled server longer than asked (what is
        # left then goes back through the lease: no error to report).
        await self._task.stop(max(0.0, deadline - loop.time()), report=False)
        if await self._flush(deadline):
            raise asyncio.CancelledError

    # -- internals ---------------------------------------------------------------------------------

    def _leave(self, waiter: _Waiter) -> None:
        """A caller stops waiting: items already handed to it go to the next waiters or back."""
        with contextlib.suppress(ValueError):
            self._waiters.remove(waiter)
        future = waiter.future
        if future.done() and not future.cancelled() and future.exception() is None:
            self._hand_out(future.result())
        else:
            future.cancel()

    def _hand_out(self, entries: list[tuple[_Pop, int, Any]]) -> None:
        """Give ``entries`` to waiters in FIFO order; what nobody takes waits in the prefetch buffer
        for at most one round trip (goes back to the list at once when closing)."""
        start = 0
        while start < len(entries) and self._waiters:
            waiter = self._waiters.popleft()
            if waiter.future.done():
                continue
            waiter.future.set_result(entries[start:start + waiter.capacity])
            start += waiter.capacity
        left = entries[start:]
        if not left:
            return
        if self._closed is not None:
            self._return(left)
            return
        self._buffer.extend(left)
        if self._hold is None:
            self._hold = asyncio.get_running_loop().call_later(self._prefetch.hold_s, self._give_back_buffer)

    def _wanted(self) -> int:
        while self._waiters and self._waiters[0].future.done():
            self._waiters.popleft()
        return sum(w.capacity for w in self._waiters if not w.future.done())

    def _end_once_waiters(self) -> None:
        for waiter in list(self._waiters):
            if waiter.once and not waiter.future.done():
                self._waiters.remove(waiter)
                waiter.future.set_result([])

    async def _run(self) -> None:
        backoff = Backoff()
        loop = asyncio.get_running_loop()
        try:
            while self._closed is None:
                wanted = self._wanted()
                if wanted and self._buffer:  # not expected (callers take from the buffer first)
                    self._cancel_hold()
                    entries = list(self._buffer)
                    self._buffer.clear()
                    self._hand_out(entries)
                    continue
                if wanted == 0 or not self._maybe_ready:
                    self._wake.clear()
                    await self._wake.wait()
                    continue
                self._maybe_ready = False
                if self._returning:  # bounded: each FINISH try is bounded by call_timeout_s
                    await asyncio.wait(set(self._returning), timeout=self._call_timeout_s)
                count = max(wanted, self._prefetch.size)
                pop = _Pop(os.urandom(16))
                self._pops.add(pop)  # unknown outcome until the reply: a flush sends FINISH '*'
                done = self._take_done_pops()  # forgotten by this POP (a cancellation: the flush FINISHes them)
                try:
                    sent = loop.time()
                    raws = await self._pop(pop, count, done)
                    self._prefetch.fetched(count, len(raws), loop.time() - sent)
                    self._pops.difference_update(done)
                except BackendError as exc:
                    for old in done:  # FINISH is idempotent: whether or not the POP forgot them
                        old.finishing = keep(asyncio.ensure_future(self._finish(old)))
                    if exc.maybe_applied:
                        self._maybe_finish(pop, unknown=True)  # return whatever it got
                    else:
                        self._pops.discard(pop)
                    delay = backoff.failed()
                    if is_permanent(exc):
                        self._fail_current(exc)
                        continue
                    log.warning("aiodelayq: pop from %r failed (%s); retrying in %.2f s",
                                self._keys.destination, exc, delay)
                    self._end_once_waiters()
                    await asyncio.sleep(delay)
                    self._maybe_ready = True
                    continue
                backoff.succeeded()
                if not raws:
                    self._pops.discard(pop)  # an empty pop records nothing
                    self._end_once_waiters()
                    continue
                self.pops += 1
                if len(raws) >= count:
                    self._maybe_ready = True  # there may be more
                self._received(pop, raws)
                self._end_once_waiters()
        except asyncio.CancelledError:
            # aclose(), or a forced shutdown (asyncio.run cancelling every task): give back what
            # we hold within the close deadline, or briefly, through further cancellations.
            self._closed = self._closed or ConnectionError("pump cancelled")
            self._give_back_buffer()
            await self._flush(self._flush_deadline or loop.time() + _SHUTDOWN_FLUSH_S)
            raise

    def _received(self, pop: _Pop, raws: list[bytes]) -> None:
        pop.received(len(raws))
        entries: list[tuple[_Pop, int, Any]] = []
        for index, raw in enumerate(raws):
            try:
                entries.append((pop, index, self._decode(raw)))
            except DecodeError as exc:
                self.undecodable += 1
                log.error("aiodelayq: %s; moved to dead-letter list %r", exc, self._keys.dead_letter)
                pop.settle(index, "x")
        self._hand_out(entries)
        self._maybe_finish(pop)

    def _fail_current(self, exc: BaseException) -> None:
        """The callers waiting now get ``exc`` (a permanent error: later callers try again)."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.future.done():
                waiter.future.set_exception(exc)
                waiter.future.exception()  # retrieved: the caller may be gone

    async def _pop(self, pop: _Pop, wanted: int, done: list[_Pop]) -> list[bytes]:
        """POP with ``pop.call_id``, forgetting the ``done`` pops; after a lost reply (or a failure
        before sending) it is resent with the same id, which returns the same items, for up to
        ``_RESEND_HORIZON_S``.

        Raises:
            BackendError: still failing at the horizon, or a final error; ``maybe_applied`` if any
                attempt may have been applied (then FINISH '*' must return what it got).
        """
        k = self._keys
        forget = [old.call_id for old in done]
        for old in done:
            old.finish_attempts += 1  # a FINISH after it must not read "found nothing" as a lost lease

        async def attempt(remaining_s: float, _resend: bool) -> list[bytes]:
            async with self._slots:
                raws: list[bytes] = await run_script(
                    self._client, POP, [k.destination, k.handoff, k.handoff_leases],
                    [pop.call_id, wanted, HANDOFF_LEASE_MS, *forget], timeout_s=min(remaining_s, self._call_timeout_s),
                    what=f"pop from {k.destination!r}")
            return raws

        return await resend_within(attempt, timeout_s=_RESEND_HORIZON_S)

    def _maybe_finish(self, pop: _Pop, *, unknown: bool = False) -> None:
        """Send FINISH once every item of ``pop`` is settled (``unknown``: the pop's reply never
        came, so FINISH '*' returns whatever it got, or makes a late pop pop nothing). A pop whose
        items were all handed out waits for the next POP to forget it instead (see ``_done_pops``)."""
        if pop.finishing is not None or not (unknown or pop.settled) or pop not in self._pops:
            return
        if not unknown and self._closed is None and all(v == "d" for v in pop.plan):
            if pop not in self._done_pops:
                self._done_pops[pop] = None
                if self._done_timer is None:
                    self._done_timer = asyncio.get_running_loop().call_later(self._prefetch.hold_s,
                                                                             self._finish_done_pops)
            return
        pop.finishing = keep(asyncio.ensure_future(self._finish(pop)))
        if "r" in pop.plan or unknown:
            self._returning.add(pop.finishing)
            pop.finishing.add_done_callback(self._returning.discard)

    def _take_done_pops(self) -> list[_Pop]:
        if self._done_timer is not None:
            self._done_timer.cancel()
            self._done_timer = None
        done = list(self._done_pops)
        self._done_pops.clear()
        return done

    def _finish_done_pops(self) -> None:
        """No POP came within a round trip: FINISH the handed-out pops on their own."""
        for pop in self._take_done_pops():
            pop.finishing = keep(asyncio.ensure_future(self._finish(pop)))

    async def _finish(self, pop: _Pop, deadline: float = math.inf) -> None:
        """FINISH ``pop``, tried again until done (it is idempotent) or ``deadline`` (loop time)."""
        plan = "*" if pop.size < 0 else "".join(v or "r" for v in pop.plan)
        if not plan:  # an empty pop records nothing
            self._pops.discard(pop)
            return
        k = self._keys

        async def attempt(timeout_s: float) -> Any:
            async with self._slots:
                pop.finish_attempts += 1
                return await run_script(
                    self._client, FINISH, [k.destination, k.handoff, k.handoff_leases, k.dead_letter, k.channel],
                    [pop.call_id, plan, HANDOFF_LEASE_MS], timeout_s=timeout_s,
                    what=f"finish a pop from {k.destination!r}")

        try:
            done = await retry_until_done(attempt, per_try_s=self._call_timeout_s, deadline=deadline)
        except BackendError as exc:
            # Given up for good (a permanent error, or the close deadline): not tried again.
            self._pops.discard(pop)
            log.warning("aiodelayq: could not finish a pop from %r (%s); the lease returns its items",
                        k.destination, exc)
            return
        self._pops.discard(pop)
        if not done and pop.finish_attempts == 1 and "d" in plan:
            # Found nothing, and no earlier FINISH of this pop may have been applied: the lease ran
            # out and the items went back.
            log.warning("aiodelayq: a pop from %r outlived its %d ms lease; its items went back to the queue "
                        "and may be delivered twice", k.destination, HANDOFF_LEASE_MS)

    async def _flush(self, deadline: float) -> bool:
        """Settle every unfinished pop ('r' for undecided items) and FINISH them, until ``deadline``,
        through cancellations (a forced shutdown cancels every task, perhaps twice): a FINISH task
        cancelled meanwhile is started again. Returns whether this task was cancelled meanwhile
        (the caller raises it). What is left at the deadline goes back through the lease."""
        loop = asyncio.get_running_loop()
        started: set[asyncio.Future[Any]] = set()
        cancelled = False
        self._take_done_pops()  # still in self._pops: FINISHed below
        while self._pops and loop.time() < deadline:
            pending: set[asyncio.Future[Any]] = set()
            for pop in list(self._pops):
                for index, verdict in enumerate(pop.plan):
                    if verdict is None:
                        pop.settle(index, "r")
                if pop.finishing is None or pop.finishing.done():
                    pop.finishing = keep(asyncio.ensure_future(self._finish(pop, deadline)))
                pending.add(pop.finishing)
            started |= pending
            cancelled = await wait_through_cancellation(pending, deadline - loop.time()) or cancelled
        left = {task for task in started if not task.done()}
        for task in left:
            task.cancel()
        if left:
            # Cancelled exchanges drop their connections within a loop turn or two; wait for that,
            # so no task outlives the loop.
            cancelled = await wait_through_cancellation(left, 0.1) or cancelled
        return cancelled
