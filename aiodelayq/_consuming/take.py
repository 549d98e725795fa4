"""Plain consuming (``take``/``take_many``/``poll``): one pump per open queue object pops due items for
the callers that wait, through a hand-off area in Redis, so nothing popped is ever lost.

Why no ``BLPOP``: a blocking pop pins one pooled connection per consumed queue (99 consumed queues
exhaust redis-py's default pool), cannot span cluster slots, and a stall longer than its read
timeout desynchronised the connection. The pump pops without blocking, when something says items
may be there: a waiter arrived (unless a pop came back short less than ``_DRAINED_FOR_S`` ago and
nothing announced items since: then the list was empty and the next transfer serves the waiter),
this process's scheduler ran a transfer (its own, or a no-op because another process moved the
items at the same due time), a returned item was announced on the channel, or the last pop came
back full. Pops share the client's few transfer slots, so a client's
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
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

from .._core.observe import Events
from .._core.tasks import TaskOwner, wait_event
from .._core.tracing import now_ns, receive_span, tracer
from .._redis.backoff import Backoff
from .._redis.connections import is_permanent
from .._redis.retry import resend_within
from .._scripts import QueueScripts
from .._scripts.foreign_keys import refusal_advice
from ..exceptions import BackendError, DecodeError
from .controls import hold_s
from .handoff import HANDOFF_LEASE_MS, Handoff, Pop
from .prefetch import PrefetchBuffer

if TYPE_CHECKING:
    from opentelemetry.trace import Tracer

__all__ = ["RESYNC", "Headed", "TakePump"]

RESYNC = object()
"""What ``decode`` returns for a stalled recurring item's resync: settled as taken, handed to nobody."""

log = logging.getLogger("aiodelayq")

# A pop whose reply was lost is resent with the same call id (which returns the same items) for at
# most this long; then it is given up with FINISH '*', and the lease covers the rest.
_RESEND_HORIZON_S = 10.0
# How long a forced shutdown (the pump task cancelled) spends returning popped items before it
# leaves them to the lease.
_SHUTDOWN_FLUSH_S = 0.5
# Prefetch (see _consuming/prefetch.py): items popped for nobody yet wait in a buffer at most one round trip.
# After a pop that came back short (the list was empty then), a waiter arriving within this long
# does not pop by itself: every way items reach the list through the queue (a transfer of this or
# another process at a due time, items given back) wakes the pump anyway. Without it, `async for`
# would send one empty POP after every transfer, as many calls as the useful ones. Items pushed straight
# into the list by other code are seen by such a waiter at most this much later.
_DRAINED_FOR_S = 0.05
# The longest a handed-out pop of a pump in a rotation waits for the pump's next POP (a crashed
# process's handed-out items come back when their lease ends: the shorter the wait, the fewer).
_DONE_HOLD_MAX_S = 0.25


class Headed(NamedTuple):
    """A decoded item that came with headers (what the pump holds for it; a bare item is held as
    itself, so the common case costs nothing more)."""

    value: Any
    headers: dict[str, str]


def _value(taken: Any) -> Any:
    return taken.value if type(taken) is Headed else taken


def _pair(taken: Any) -> tuple[Any, dict[str, str]]:
    return (taken.value, taken.headers) if type(taken) is Headed else (taken, {})


@dataclass(eq=False)
class _Waiter:
    future: asyncio.Future[list[tuple[Pop, int, Any]]]
    capacity: int
    once: bool  # poll without waiting: one pop attempt, then [] if nothing came


class TakePump:
    """Serves decoded items of one queue to waiters in FIFO order (see the module docstring).

    ``rotation``: how many pumps a caller visits in turn, this one among them (a sharded queue's
    shards; 1: callers come to this pump alone). A pop whose items were all handed out waits that
    many round trips (at most ``_DONE_HOLD_MAX_S``) for this pump's next POP to forget it, instead of
    a FINISH of its own.
    """

    def __init__(self, scripts: QueueScripts, tasks: TaskOwner, *, decode: Callable[[bytes], Any],
                 slots: asyncio.Semaphore, events: Events, rotation: int = 1) -> None:
        self._scripts = scripts
        self._events = events
        self._keys = keys = scripts.keys
        self._decode = decode
        self._slots = slots
        self._call_timeout_s = scripts.call_timeout_s
        self._waiters: collections.deque[_Waiter] = collections.deque()
        self._wake = asyncio.Event()
        self._maybe_ready = True
        self._drained_at: float | None = None  # loop time of the latest short pop (see _DRAINED_FOR_S)
        self._recheck: asyncio.TimerHandle | None = None
        # Started by the first caller; restarted after a crash while callers wait.
        self._task = tasks.supervise(f"aiodelayq-take:{keys.destination}", self._run, restart_after_s=0.1,
                                     wanted=lambda: self._closed is None and bool(self._waiters),
                                     on_crash=lambda _exc: self.notify())
        # Prefetched items no caller has yet, in pop order, still in the hand-off; held at most one
        # round trip, then back to the head of the list.
        self._buffer: PrefetchBuffer[tuple[Pop, int, Any]] = PrefetchBuffer(self._return)
        self._prefetch = self._buffer.prefetch
        self._handoff = Handoff(scripts, tasks, slots=slots,
                                hold_s=lambda: min(_DONE_HOLD_MAX_S, self._prefetch.hold_s * rotation),
                                closing=lambda: self._closed is not None)
        # The scheduler's request that the next POP transfer first (see ask_transfer).
        self._transfer_ask: tuple[int, asyncio.Future[Any]] | None = None
        self._backing_off = False  # after a failed POP: the scheduler transfers itself meanwhile
        # After a POP the queue's controls refused (paused, rate limited): no POP before this loop
        # time, whatever wakes the pump (see _consuming/controls.py).
        self._held_until: float | None = None
        self._limited = False  # the last POP met the rate limit: pop only what callers want
        self._closed: BaseException | None = None
        self._flush_deadline: float | None = None
        # Done, and dropped, each time items may have reached the list from outside this pump's own
        # pops (see signal); made only when a caller asks for it.
        self._signal: asyncio.Future[None] | None = None

    def __repr__(self) -> str:
        return (f"<TakePump {self._keys.destination!r} waiters={len(self._waiters)} buffered={len(self._buffer)} "
                f"prefetch={self._prefetch.size} closed={self._closed is not None} {self._handoff!r} "
                f"task={self._task!r}>")

    # -- a caller across several pumps (a sharded queue) -------------------------------------------

    @property
    def signal(self) -> asyncio.Future[None]:
        """A future that is done once items may have reached the list (a transfer, items given back,
        the queue closing, a failed pop's backoff over): a caller that waits on several pumps takes
        it before it looks, so no announcement between its look and its wait is missed. Its own
        looks (``get(..., once=True)``) do not set it."""
        if self._signal is None:
            self._signal = asyncio.get_running_loop().create_future()
        return self._signal

    @property
    def prefetched(self) -> bool:
        """Whether prefetched items wait for a caller and nobody waits before it: a ``get`` now returns
        some at once, without a round trip and without suspending."""
        return self._closed is None and bool(self._buffer) and not self._waiters

    def idle(self) -> bool:
        """Whether a pop now would most likely find nothing, or not be sent yet: the last pop came
        back short and nothing announced items since, or the pump waits out a failed pop's backoff
        (never once closing: a look then raises the closing error; nor while the scheduler waits for
        this pump's next POP to transfer)."""
        return self._closed is None and not self._buffer and self._transfer_ask is None and (
            self._backing_off or (self._drained_at is not None and not self._maybe_ready))

    def held_s(self) -> float:
        """Seconds until the queue's controls let this pump pop again (0: not held)."""
        if self._held_until is None:
            return 0.0
        return max(0.0, self._held_until - asyncio.get_running_loop().time())

    def _announce(self) -> None:
        """Items may be in the list: whoever waits on :attr:`signal` looks again."""
        if self._signal is not None and not self._signal.done():
            self._signal.set_result(None)
        self._signal = None

    # -- callers -----------------------------------------------------------------------------------

    async def get(self, timeout_s: float | None, max_items: int = 1, *, once: bool = False,
                  with_headers: bool = False, traced: bool = True) -> list[Any]:
        """Up to ``max_items`` decoded items; waits up to ``timeout_s`` (``None``: forever) for at
        least one, ``[]`` after it. ``once`` (or a ``timeout_s`` of 0): a single pop attempt, no
        waiting. ``with_headers``: ``(item, headers)`` pairs instead of items. A call that returns
        items is a ``receive`` span while an OpenTelemetry SDK is set up (``traced``).

        Raises:
            the exception given to :meth:`fail_waiters` once closing; a permanent
            :class:`BackendError` (e.g. missing permission) of the pop; and the caller's own
            ``asyncio.CancelledError``, without losing a popped item.
        """
        if self._closed is not None:
            raise self._closed
        found = tracer() if traced else None
        if found is not None:
            return await self._get_traced(found, timeout_s, max_items, once, with_headers)
        if timeout_s == 0:
            once, timeout_s = True, None
        if self._buffer and not self._waiters:  # prefetched: no round trip, no await
            if max_items == 1:  # async for, take(): the hot path, without the batch bookkeeping
                pop, index, taken = self._buffer.pop()
                pop.settle(index, "d")
                if not pop.undecided:
                    self._handoff.maybe_finish(pop)
                self._events.delivered(1)
                if not self._buffer and self._transfer_ask is not None:
                    self._buffer_emptied()
                return [_pair(taken) if with_headers else _value(taken)]
            delivered = self._deliver(self._buffer.take(max_items), with_headers)
            if not self._buffer and self._transfer_ask is not None:
                self._buffer_emptied()
            return delivered
        loop = asyncio.get_running_loop()
        waiter = _Waiter(loop.create_future(), max_items, once)
        self._waiters.append(waiter)
        if once or not self._just_drained(loop.time()):
            self._poke()
        else:
            self._recheck_later(loop)
            self._wake.set()
        self._task.start()
        try:
            await asyncio.wait({waiter.future}, timeout=timeout_s)
        except asyncio.CancelledError:
            self._leave(waiter)
            raise
        if not waiter.future.done():
            self._leave(waiter)
            return []
        return self._deliver(waiter.future.result(), with_headers)  # raises fail_waiters' exception

    async def _get_traced(self, found: Tracer, timeout_s: float | None, max_items: int, once: bool,
                          with_headers: bool) -> list[Any]:
        started_ns = now_ns()
        pairs = await self.get(timeout_s, max_items, once=once, with_headers=True, traced=False)
        if pairs:
            receive_span(found, self._keys.destination, "take", started_ns, [headers for _, headers in pairs])
        return pairs if with_headers else [value for value, _ in pairs]

    def _deliver(self, entries: list[tuple[Pop, int, Any]], with_headers: bool) -> list[Any]:
        """The caller has ``entries``: record them as taken; returns their values (``(value,
        headers)`` pairs ``with_headers``)."""
        self._settle(entries, "d")
        if entries:
            self._events.delivered(len(entries))
        if with_headers:
            return [_pair(taken) for _, _, taken in entries]
        return [_value(taken) for _, _, taken in entries]

    def _settle(self, entries: list[tuple[Pop, int, Any]], verdict: str) -> None:
        """Record ``verdict`` for ``entries`` and finish the pops that are now settled."""
        for pop, index, _ in entries:
            pop.settle(index, verdict)
        for pop in {id(pop): pop for pop, _, _ in entries}.values():
            self._handoff.maybe_finish(pop)

    def _buffer_emptied(self) -> None:
        """A caller took the last prefetched items while the scheduler's transfer request waits for
        the buffer's taker (see ask_transfer): unless that caller (or another) waits within the hold,
        the pump answers it then, and the scheduler transfers itself. A caller that takes from
        several pumps in turn (a sharded queue) may not come back to this one."""
        asyncio.get_running_loop().call_later(self._prefetch.hold_s, self._wake.set)

    def _return(self, entries: list[tuple[Pop, int, Any]]) -> None:
        """Nobody takes ``entries``: back to the head of the list."""
        self._events.count("returned", len(entries))
        self._drained_at = None  # they will be in the list: the next waiter pops them
        self._settle(entries, "r")
        self._wake.set()  # a transfer request kept for the buffer's taker is answered now (see _run)
        self._announce()

    def notify(self) -> None:
        """Items may be in the destination now: pop for the waiters."""
        self._poke()
        self._announce()

    def _poke(self) -> None:
        """Pop for the waiters (their items may be in the list)."""
        self._maybe_ready = True
        self._drained_at = None
        self._wake.set()

    def _just_drained(self, now: float) -> bool:
        """A pop found the list empty less than ``_DRAINED_FOR_S`` before ``now`` (loop time), and
        nothing announced items since."""
        return self._drained_at is not None and now < self._drained_at + _DRAINED_FOR_S

    def _recheck_later(self, loop: asyncio.AbstractEventLoop) -> None:
        """A waiter did not pop because the list was just found empty: pop for it anyway once that
        is ``_DRAINED_FOR_S`` old, unless something woke the pump before."""
        if self._recheck is None:
            assert self._drained_at is not None
            self._recheck = loop.call_at(self._drained_at + _DRAINED_FOR_S, self._rechecked)

    def _cancel_recheck(self) -> None:
        if self._recheck is not None:
            self._recheck.cancel()
            self._recheck = None

    def _rechecked(self) -> None:
        self._recheck = None
        if self._closed is not None or not self._waiters:
            return
        loop = asyncio.get_running_loop()
        if self._just_drained(loop.time()):
            self._recheck_later(loop)  # a later short pop: from that one
            return
        self.notify()

    def ask_transfer(self, limit: int) -> asyncio.Future[Any] | None:
        """The scheduler would transfer now. If callers are waiting, or one is still taking from the
        prefetch buffer (it will wait within about a round trip: the buffer is held no longer), the
        next POP transfers first (up to ``|limit|`` elements; negative: its reply also carries the
        lateness of what moved, see POP's ARGV[4]): one round trip instead of a TRANSFER and then a
        POP. Returns a future of ``(sent, received, transfer reply)`` (loop times of the
        call; the reply is ``None`` when the POP was a resend that did not transfer) or of ``None``
        when the pump did not do it (the scheduler then transfers itself); ``None`` at once when
        nobody waits."""
        if (self._closed is not None or self._backing_off or self._held_until is not None
                or self._transfer_ask is not None or not (self._wanted() or self._buffer)):
            return None
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._transfer_ask = (limit, future)
        self._wake.set()
        return future

    def _answer_ask(self) -> None:
        """The pump will not transfer for the scheduler: it transfers itself."""
        ask, self._transfer_ask = self._transfer_ask, None
        if ask is not None:
            _resolve(ask[1], None)

    def fail_waiters(self, exc: BaseException) -> None:
        """Close for callers: wake every waiter with ``exc`` and raise it from later calls."""
        self._closed = exc
        self._wake.set()
        self._cancel_recheck()
        self._answer_ask()
        self._fail_current(exc)
        self._buffer.give_back()
        self._announce()

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
        if await self._handoff.flush(deadline):
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

    def _hand_out(self, entries: list[tuple[Pop, int, Any]]) -> None:
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
        self._buffer.keep(left)

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
        backoff = Backoff(f"pop from {self._keys.destination!r}")
        loop = asyncio.get_running_loop()
        try:
            while self._closed is None:
                wanted = self._wanted()
                if wanted and self._buffer:  # not expected (callers take from the buffer first)
                    self._hand_out(self._buffer.take(len(self._buffer)))
                    continue
                if wanted == 0 and not self._buffer:
                    self._answer_ask()  # the waiters left: the scheduler transfers itself
                if wanted == 0 or not (self._maybe_ready or self._transfer_ask):
                    self._wake.clear()
                    await self._wake.wait()
                    continue
                if self._held_until is not None:
                    if (remaining := self._held_until - loop.time()) > 0:
                        self._answer_ask()  # the scheduler transfers itself meanwhile
                        self._end_once_waiters()  # poll(): its one attempt was refused
                        self._wake.clear()
                        await wait_event(self._wake, remaining)
                        continue
                    self._held_until = None
                self._maybe_ready = False
                await self._handoff.returns_landed()  # a POP must not overtake items given back
                count = wanted if self._limited else max(wanted, self._prefetch.size)
                pop = Pop(os.urandom(16))
                self._handoff.pops.add(pop)  # unknown outcome until the reply: a flush sends FINISH '*'
                done = self._handoff.take_done()  # forgotten by this POP (cancelled: the flush FINISHes them)
                limit, ask = self._transfer_ask or (0, None)
                self._transfer_ask = None
                try:
                    sent = loop.time()
                    moved, hold, expired, raws = await self._pop(pop, count, done, limit)
                    received = loop.time()
                    self._prefetch.fetched(count, len(raws), received - sent)
                    self._handoff.forgot(done)
                    if ask is not None:
                        if moved is not None:
                            self._events.count("pops_that_transferred")
                        _resolve(ask, (sent, received, moved))
                except BaseException as exc:
                    if ask is not None:  # the scheduler transfers itself (and reports its own failure)
                        _resolve(ask, None)
                    if not isinstance(exc, BackendError):
                        raise
                    self._handoff.refinish(done)
                    if exc.maybe_applied:
                        self._handoff.maybe_finish(pop, unknown=True)  # return whatever it got
                    else:
                        self._handoff.pops.discard(pop)
                    if is_permanent(exc):
                        backoff.count()  # the callers get it
                        self._fail_current(exc)
                        continue
                    delay = backoff.count()
                    advice = await refusal_advice(self._scripts, exc) if backoff.level(exc) >= logging.ERROR else ""
                    backoff.report(exc, delay, advice=advice)
                    self._end_once_waiters()
                    self._answer_ask()  # the scheduler does not wait out our backoff
                    self._backing_off = True
                    try:
                        await asyncio.sleep(delay)
                    finally:
                        self._backing_off = False
                    self._maybe_ready = True
                    self._announce()
                    continue
                backoff.succeeded()
                if expired:
                    self._events.dead_lettered(expired, "expired")
                    log.debug("%d item(s) of %r expired before delivery; moved to dead-letter list %r",
                              expired, self._keys.destination, self._keys.dead_letter)
                self._limited = hold > 0
                if hold:  # the controls refused some or all: ask again later, not at the next wake-up
                    self._held_until = received + hold_s(hold)
                    self._maybe_ready = True
                elif len(raws) + expired < count and not self._maybe_ready:  # the list was empty, nothing said since
                    self._drained_at = received
                if not raws:
                    if expired:
                        self._maybe_ready = True  # the items after them may not have expired
                    elif moved is None and not hold:
                        self._events.count("empty_pops")
                    self._handoff.pops.discard(pop)  # an empty pop records nothing
                    self._end_once_waiters()
                    continue
                self._events.count("pops")
                if len(raws) + expired >= count:
                    self._maybe_ready = True  # there may be more
                self._received(pop, raws)
                self._end_once_waiters()
        except asyncio.CancelledError:
            # aclose(), or a forced shutdown (asyncio.run cancelling every task): give back what
            # we hold within the close deadline, or briefly, through further cancellations.
            self._closed = self._closed or ConnectionError("pump cancelled")
            self._cancel_recheck()
            self._answer_ask()
            self._buffer.give_back()
            await self._handoff.flush(self._flush_deadline or loop.time() + _SHUTDOWN_FLUSH_S)
            raise

    def _received(self, pop: Pop, raws: list[bytes]) -> None:
        pop.received(len(raws))
        entries: list[tuple[Pop, int, Any]] = []
        for index, raw in enumerate(raws):
            try:
                taken = self._decode(raw)
                if taken is RESYNC:
                    pop.settle(index, "d")
                    continue
                entries.append((pop, index, taken))
            except DecodeError as exc:
                self._events.count("undecodable")
                log.error("%s; moved to dead-letter list %r", exc, self._keys.dead_letter)
                pop.settle(index, "x")
        if len(entries) < len(raws):
            # Counted when decided: the FINISH that writes them goes out with the pop's other verdicts.
            self._events.dead_lettered(len(raws) - len(entries), "undecodable")
        self._hand_out(entries)
        self._handoff.maybe_finish(pop)

    def _fail_current(self, exc: BaseException) -> None:
        """The callers waiting now get ``exc`` (a permanent error: later callers try again)."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.future.done():
                waiter.future.set_exception(exc)
                waiter.future.exception()  # retrieved: the caller may be gone

    async def _pop(self, pop: Pop, wanted: int, done: list[Pop], transfer: int) -> tuple[Any, int, int, list[bytes]]:
        """POP with ``pop.call_id``, forgetting the ``done`` pops, transferring up to ``|transfer|``
        elements first (0: none; negative: with lateness, see ``_core.observe.transfer_limit``); returns
        the transfer's reply (``None`` when none ran), the controls' hold (see POP), how many popped
        items had expired (dead-lettered by POP) and the items.
        After a lost reply (or a failure before sending) it is resent with the same id, which
        returns the same items without transferring again, for up to ``_RESEND_HORIZON_S``.

        Raises:
            BackendError: still failing at the horizon, or a final error; ``maybe_applied`` if any
                attempt may have been applied (then FINISH '*' must return what it got).
        """
        k = self._keys
        forget = self._handoff.forgotten(done)

        async def attempt(remaining_s: float, _resend: bool) -> tuple[Any, int, int, list[bytes]]:
            async with self._slots:
                reply: list[Any] = await self._scripts.pop(
                    pop.call_id, wanted, HANDOFF_LEASE_MS, transfer, *forget,
                    timeout_s=min(remaining_s, self._call_timeout_s), what=f"pop from {k.destination!r}")
            return reply[0], int(reply[1]), int(reply[2]), reply[3:]

        return await resend_within(attempt, timeout_s=_RESEND_HORIZON_S)


def _resolve(future: asyncio.Future[Any], result: Any) -> None:
    """Settle ``future`` unless its waiter gave up on it."""
    if not future.done():
        future.set_result(result)
