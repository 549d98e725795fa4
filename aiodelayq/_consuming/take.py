"""Plain consuming (``take``/``take_many``/``poll``): one pump per open queue object pops due items for
the callers that wait, through a hand-off area in Redis, so nothing popped is ever lost.

No ``BLPOP``: it pins a pooled connection per queue, cannot span cluster slots, and a stall past
its read timeout desynchronises the connection. The pump pops without blocking when items may be
there (a waiter arrived, a transfer ran, a return was announced, the last pop came back full),
sharing the client's transfer slots. Its phases are in ``take_phases.py``, its callers in
``take_waiters.py``, its read-ahead (the next POP out while a full one's items are decoded) in
``take_ahead.py``, the decoding of a pop's items in ``take_decode.py``.

POP moves items into ``aiodelayq_handoff:{N}`` under a lease; once every item of a pop is settled
one FINISH removes the entry. What a killed process leaves goes back to the head of the
destination when the lease ends.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from .._redis.backoff import Backoff
from .._redis.connections import is_permanent
from .._scripts import QueueScripts
from .._scripts.foreign_keys import refusal_advice
from .._util.observe import Events
from .._util.tasks import TaskOwner, wait_event
from .._util.tracing import tracer
from .._wire.codec import Headed
from ..exceptions import BackendError
from .handoff import Handoff, Pop, Popped
from .prefetch import PrefetchBuffer
from .take_ahead import Backlog, ReadAhead
from .take_decode import PopDecoder
from .take_phases import Outlook, Phase
from .take_waiters import Entry, Waiter, Waiters
from .traced import traced_take

__all__ = ["NOT_PREFETCHED", "TakePump"]

log = logging.getLogger("aiodelayq")

# How long a forced shutdown spends returning popped items before it leaves them to the lease.
_SHUTDOWN_FLUSH_S = 0.5
# Cap on how long a handed-out pop waits for the next POP to forget it: a crashed process's
# handed-out items only come back at lease end, so the shorter, the fewer.
_DONE_HOLD_MAX_S = 0.25


NOT_PREFETCHED: Any = object()
"""What :meth:`TakePump.get_prefetched` returns when the caller must call :meth:`TakePump.get`."""


def _pair(taken: Any) -> tuple[Any, dict[str, str]]:
    return (taken.value, taken.headers) if type(taken) is Headed else (taken, {})


class TakePump:
    """Serves decoded items of one queue to waiters in FIFO order.

    ``decode``: a stored payload's item (raising :class:`DecodeError`); ``decode_batch``: a whole
    pop's items at once when all are bare payloads, else ``ValueError`` (``_wire.codec.batch_decoder``).
    ``rotation``: how many pumps a caller visits in turn (a sharded queue's shards); a fully handed-out
    pop waits that many round trips for the next POP to forget it instead of a FINISH of its own.
    """

    def __init__(self, scripts: QueueScripts, tasks: TaskOwner, *, decode: Callable[[bytes], Any],
                 decode_batch: Callable[[list[bytes]], list[Any]] | None = None,
                 slots: asyncio.Semaphore, events: Events, rotation: int = 1) -> None:
        self._scripts = scripts
        self._events = events
        self._keys = keys = scripts.keys
        self._decoder = PopDecoder(decode, decode_batch, events, keys.dead_letter)
        self._waiters = Waiters()
        self._wake = asyncio.Event()
        self._outlook = Outlook()
        self._phase = Phase.IDLE
        self._task = tasks.supervise(f"aiodelayq-take:{keys.destination}", self._run, restart_after_s=0.1,
                                     wanted=lambda: self._closed is None and bool(self._waiters),
                                     on_crash=lambda _exc: self.notify())
        self._buffer: PrefetchBuffer[Entry] = PrefetchBuffer(self._return)
        self._prefetch = self._buffer.prefetch
        self._handoff = Handoff(scripts, tasks, slots=slots,
                                hold_s=lambda: min(_DONE_HOLD_MAX_S, self._prefetch.hold_s * rotation),
                                closing=lambda: self._closed is not None)
        self._transfer_ask: tuple[int, asyncio.Future[Any]] | None = None
        # While a backlog drains: each POP transfers up to |limit| first and reports the reply.
        self._backlog: Backlog | None = None
        self._ahead = ReadAhead(self._handoff, tasks, keys.destination, wake=self._wake)
        # No prefetched item went back unclaimed since the buffer last emptied: callers keep up.
        self._keeping_up = True
        self._closed: BaseException | None = None  # closing: what callers get
        self._flush_deadline: float | None = None
        # Made only when a caller asks for it (see signal).
        self._signal: asyncio.Future[None] | None = None

    def __repr__(self) -> str:
        return (f"<TakePump {self._keys.destination!r} {self._phase.value} waiters={len(self._waiters)} "
                f"buffered={len(self._buffer)} prefetch={self._prefetch.size} closed={self._closed is not None} "
                f"{self._outlook!r} {self._handoff!r} task={self._task!r}>")

    # -- a caller across several pumps (a sharded queue) -------------------------------------------

    @property
    def signal(self) -> asyncio.Future[None]:
        """Done once items may have reached the list; a caller waiting on several pumps takes it
        before it looks, so no announcement between its look and its wait is missed."""
        if self._signal is None:
            self._signal = asyncio.get_running_loop().create_future()
        return self._signal

    @property
    def prefetched(self) -> bool:
        """Whether a ``get`` now returns prefetched items without suspending."""
        return self._closed is None and bool(self._buffer) and not self._waiters

    def idle(self) -> bool:
        """Whether a pop now would most likely find nothing or not be sent (drained, or backing off);
        never once closing, nor while the transfer task waits for this pump's next POP, nor with a
        read-ahead in flight."""
        return (self._closed is None and not self._buffer and self._transfer_ask is None
                and self._ahead.ahead is None and (self._phase is Phase.BACKING_OFF or self._outlook.drained))

    @property
    def topping_up(self) -> bool:
        """Whether a POP that tops up while a backlog drains is out (its report follows its reply)."""
        return self._backlog is not None and (self._phase is Phase.POP or self._ahead.ahead is not None)

    def held_s(self) -> float:
        """Seconds until the queue's controls let this pump pop again (0: not held)."""
        return self._outlook.held_s(asyncio.get_running_loop().time())

    def _announce(self) -> None:
        """Items may be in the list: whoever waits on :attr:`signal` looks again."""
        if self._signal is not None and not self._signal.done():
            self._signal.set_result(None)
        self._signal = None

    # -- callers -----------------------------------------------------------------------------------

    async def get(self, timeout_s: float | None, max_items: int = 1, *, once: bool = False,
                  with_headers: bool = False, traced: bool = True) -> list[Any]:
        """Up to ``max_items`` decoded items; waits up to ``timeout_s`` (``None``: forever) for at
        least one, ``[]`` after it. ``once`` (or ``timeout_s`` 0): one pop attempt. ``with_headers``:
        ``(item, headers)`` pairs. ``traced``: a ``receive`` span when OpenTelemetry is set up.

        Raises:
            the exception given to :meth:`fail_waiters` once closing; a permanent
            :class:`BackendError` (e.g. missing permission) of the pop; and the caller's own
            ``asyncio.CancelledError``, without losing a popped item.
        """
        if self._closed is not None:
            raise self._closed
        if traced and (found := tracer()) is not None:
            return await traced_take(found, self._keys.destination,
                                     self.get(timeout_s, max_items, once=once, with_headers=True, traced=False),
                                     with_headers)
        if self._buffer and not self._waiters:  # prefetched: no round trip, no await
            delivered = self._deliver(self._buffer.take(max_items), with_headers)
            if not self._buffer:
                self._buffer_emptied()
            return delivered
        if timeout_s == 0:
            once, timeout_s = True, None
        loop = asyncio.get_running_loop()
        waiter = Waiter(loop.create_future(), max_items, once)
        self._waiters.append(waiter)
        if once or not self._outlook.just_drained(loop.time()):
            self._poke()
        else:
            self._outlook.recheck_later(loop, self._rechecked)
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

    def get_prefetched(self) -> Any:
        """``async for`` and ``take()``'s hot path: the next prefetched item, as :meth:`get` of one
        item without headers would return it, without a coroutine; :data:`NOT_PREFETCHED` when
        :meth:`get` must run (nothing prefetched, callers waiting, closing, or spans to record)."""
        buffer = self._buffer
        if self._closed is not None or self._waiters or not buffer or buffer.traced:
            return NOT_PREFETCHED
        pop, index, taken = buffer.take_oldest()
        pop.settle(index, "d")
        if not pop.undecided:
            self._handoff.maybe_finish(pop)
        self._events.delivered(1)
        if not buffer:
            self._buffer_emptied()
        return taken.value if type(taken) is Headed else taken  # inline: once per item of async for

    def _deliver(self, entries: list[Entry], with_headers: bool) -> list[Any]:
        """Record ``entries`` as taken; return their values (or pairs)."""
        self._settle(entries, "d")
        if entries:
            self._events.delivered(len(entries))
        if with_headers:
            return [_pair(taken) for _, _, taken in entries]
        return [taken.value if type(taken) is Headed else taken for _, _, taken in entries]  # inline: per item

    def _settle(self, entries: list[Entry], verdict: str) -> None:
        """Record ``verdict`` for ``entries`` and finish the pops that are now settled. Entries come
        in runs of one pop's consecutive items (a batch is most often one run): settled a run at a time."""
        if not entries:
            return
        first, last = entries[0], entries[-1]
        if first[0] is last[0] and last[1] - first[1] == len(entries) - 1:  # one run: the common case
            first[0].settle(first[1], verdict, last[1] + 1)
            self._handoff.maybe_finish(first[0])
            return
        pops: dict[Pop, None] = {}
        run: Pop | None = None
        start = stop = 0
        for pop, index, _ in entries:
            if pop is run and index == stop:
                stop += 1
                continue
            if run is not None:
                run.settle(start, verdict, stop)
            pops[pop] = None
            run, start, stop = pop, index, index + 1
        if run is not None:
            run.settle(start, verdict, stop)
        # Given back, the later pop's items go first (they go to the head of the list).
        for pop in reversed(pops) if verdict == "r" else pops:
            self._handoff.maybe_finish(pop)

    def _buffer_emptied(self) -> None:
        """A caller took the buffer's last item: the callers keep up. If a transfer request waits for
        its taker, unless a caller waits within the hold, answer it then (a sharded queue's caller may
        not come back)."""
        self._keeping_up = True
        if self._transfer_ask is not None:
            asyncio.get_running_loop().call_later(self._prefetch.hold_s, self._wake.set)

    def _return(self, entries: list[Entry]) -> None:
        """Nobody takes ``entries``: back to the head of the list (after what a read-ahead got, which
        goes back first)."""
        self._keeping_up = False
        if (ahead := self._ahead.take()) is not None:  # (its POP runs on: returned once it landed)
            self._handoff.return_first(ahead.pop, ahead.task)
        self._events.count("returned", len(entries))
        self._outlook.drained_at = None  # they will be in the list: the next waiter pops them
        self._settle(entries, "r")
        self._wake.set()  # a transfer request kept for the buffer's taker is answered now (see _run)
        self._announce()

    def _leave(self, waiter: Waiter) -> None:
        """A caller stops waiting: items already handed to it go to the next waiters or back."""
        self._give_to_waiters(self._waiters.leave(waiter))

    def _give_to_waiters(self, entries: list[Entry]) -> None:
        """Give ``entries`` to waiters in FIFO order; the rest to the prefetch buffer (back when closing)."""
        left = self._waiters.serve(entries)
        if not left:
            self._keeping_up = True
            return
        if self._closed is not None:
            self._return(left)
            return
        self._buffer.keep(left)

    # -- what wakes the pump -----------------------------------------------------------------------

    def notify(self) -> None:
        """Items may be in the destination now: pop for the waiters."""
        self._poke()
        self._announce()

    def _poke(self) -> None:
        self._outlook.items_may_be_there()
        self._wake.set()

    def _rechecked(self) -> None:
        """The list found empty just before a waiter came is ``DRAINED_FOR_S`` old: pop for it."""
        if self._closed is not None or not self._waiters:
            return
        loop = asyncio.get_running_loop()
        if self._outlook.just_drained(loop.time()):
            self._outlook.recheck_later(loop, self._rechecked)  # a later short pop: from that one
            return
        self.notify()

    def ask_transfer(self, limit: int) -> asyncio.Future[Any] | None:
        """If callers wait (or are taking from the buffer), the next POP transfers first (``limit``:
        POP's ARGV[4]): one round trip instead of two. A future of ``(sent, received, reply)`` (reply
        ``None`` for a resend) or of ``None`` when the pump did not; ``None`` at once when nobody waits,
        or when a read-ahead POP is out (the next POP would come after it)."""
        if (self._closed is not None or self._phase is Phase.BACKING_OFF or self._outlook.held_until is not None
                or self._transfer_ask is not None or self._ahead.ahead is not None
                or not (self._waiters.wanted() or self._buffer)):
            return None
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._transfer_ask = (limit, future)
        self._wake.set()
        return future

    def transfer_in_pops(self, limit: int, report: Callable[[float, float, Any], object]) -> None:
        """While a backlog drains (``limit`` != 0; negative: with lateness), each POP tops up: it pops
        the list, then moves the items it still wants (they skip the list), and hands ``(sent,
        received, reply)`` to ``report``, until one finds nothing more due or ``limit`` is 0. The
        transfer task stands aside while these POPs leave the list empty (``_runtime/transfer_task.py``)."""
        self._backlog = (limit, report) if limit else None

    def _answer_ask(self) -> None:
        """The pump will not transfer for the transfer task: it transfers itself."""
        ask, self._transfer_ask = self._transfer_ask, None
        if ask is not None:
            _resolve(ask[1], None)

    # -- closing -----------------------------------------------------------------------------------

    def fail_waiters(self, exc: BaseException) -> None:
        """Close for callers: wake every waiter with ``exc`` and raise it from later calls."""
        self._closed = exc
        self._wake.set()
        self._outlook.cancel_recheck()
        self._answer_ask()
        self._waiters.fail(exc)
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
        # A pop in flight is abandoned at once; the flush settles it within the same deadline, so a
        # stalled server never holds closing longer than asked (the lease returns the rest).
        await self._task.stop(max(0.0, deadline - loop.time()), report=False)
        if await self._handoff.flush(deadline):
            raise asyncio.CancelledError

    # -- the pump's task: its phases (see _consuming/take_phases.py) -------------------------------

    async def _run(self) -> None:
        backoff = Backoff(f"pop from {self._keys.destination!r}")
        loop = asyncio.get_running_loop()
        try:
            while self._closed is None:
                wanted = self._waiters.wanted()
                self._phase = phase = self._outlook.next_phase(wanted, bool(self._buffer),
                                                               self._transfer_ask is not None, loop.time())
                if phase is Phase.SERVE:
                    self._give_to_waiters(self._buffer.take(len(self._buffer)))
                elif self._ahead.ahead is not None and (wanted or self._ahead.done):
                    self._phase = Phase.POP  # its items: for the waiters, else kept as prefetched
                    await self._pop(wanted, backoff)
                elif phase is Phase.POP:
                    await self._pop(wanted, backoff)
                else:
                    await self._sleep(phase is Phase.HELD)
        except asyncio.CancelledError:
            # aclose() or a forced shutdown: give back what we hold within the deadline, or briefly.
            self._closed = self._closed or ConnectionError("pump cancelled")
            self._outlook.cancel_recheck()
            self._answer_ask()
            self._buffer.give_back()  # a read-ahead's items go back first (see _return)
            self._ahead.drop()
            await self._handoff.flush(self._flush_deadline or loop.time() + _SHUTDOWN_FLUSH_S)
            raise
        finally:
            self._ahead.drop()  # closing: the flush returns what it got (its pop is unfinished)

    async def _sleep(self, held: bool) -> None:
        """IDLE: wait for a wake-up; ``held`` (HELD): for the end of the controls' hold at most."""
        if held or not self._buffer:
            self._answer_ask()  # a hold, or nobody left to take: the transfer task transfers itself
        if held:
            self._waiters.end_once()  # poll(): its one attempt was refused
        self._wake.clear()
        await (wait_event(self._wake, self.held_s()) if held else self._wake.wait())

    async def _pop(self, wanted: int, backoff: Backoff) -> None:
        """One pop for ``wanted`` items and a prefetch (the read-ahead's, if one is out), transferring
        first if asked or while a backlog drains; a full one, whose callers keep up, sends the next
        before its items are decoded (``take_ahead.py``)."""
        loop = asyncio.get_running_loop()
        ahead = self._ahead.take()
        popping: Awaitable[Popped]
        if ahead is None:
            self._outlook.popping()
            await self._handoff.returns_landed()  # a POP must not overtake items given back
            count = wanted if self._outlook.limited else max(wanted, self._prefetch.size)
            (limit, ask), self._transfer_ask = self._transfer_ask or (0, None), None
            backlog = self._backlog if ask is None else None
            limit = backlog[0] if backlog is not None else limit
            sent = loop.time()
            popping = self._handoff.pop(count, limit, top_up=backlog is not None)
        else:  # sent while the last pop's items were decoded (a transfer ask waits for the next)
            popping, count, sent, backlog = ahead.task, ahead.size, ahead.sent, ahead.backlog
            limit, ask = backlog[0] if backlog is not None else 0, None
        try:
            pop, moved, hold, expired, raws = await popping
        except BaseException as exc:
            if ask is not None:  # the transfer task transfers itself (and reports its own failure)
                _resolve(ask, None)
            if not isinstance(exc, BackendError):
                raise
            await self._pop_failed(exc, backoff)
            return
        received = loop.time()
        # A top-up moves at most the transfer's batch: one that stopped with more due counts as full.
        more_due = backlog is not None and moved is not None and _more_due(moved)
        got = count if more_due else len(raws)
        self._prefetch.fetched(count, got, received - sent)
        if ask is not None:
            if moved is not None:
                self._events.count("pops_that_transferred")
            _resolve(ask, (sent, received, moved))
        elif backlog is not None and (moved is not None or (raws and not hold)):
            if moved is not None:
                self._events.count("pops_that_transferred")
                if not more_due and self._backlog is backlog:
                    self._backlog = None  # drained: the transfer task's own wake-ups suffice again
            # After this pop, as an ask's future would; None: the list held what it wanted.
            loop.call_soon(backlog[1], sent, received, moved)
        backoff.succeeded()
        if expired:
            self._events.dead_lettered(expired, "expired")
            log.debug("%d item(s) of %r expired before delivery; moved to dead-letter list %r",
                      expired, self._keys.destination, self._keys.dead_letter)
        self._outlook.popped(count, got, expired, hold, received)
        if raws:
            self._events.count("pops")
            if (got == count > 1 and wanted and not hold and self._keeping_up and not self._buffer
                    and self._closed is None and self._transfer_ask is None and not self._handoff.returning):
                await self._ahead.send(max(count, self._prefetch.size), self._backlog)  # as the next would
            self._received(pop, raws)
        elif not expired and moved is None and not hold:
            self._events.count("empty_pops")
        self._waiters.end_once()

    async def _pop_failed(self, exc: BackendError, backoff: Backoff) -> None:
        """A POP failed: a permanent error goes to the waiters of the moment; otherwise BACKING_OFF."""
        if is_permanent(exc):
            backoff.count()  # the callers get it
            self._waiters.fail(exc)
            return
        delay = backoff.count()
        advice = await refusal_advice(self._scripts, exc) if backoff.level(exc) >= logging.ERROR else ""
        backoff.report(exc, delay, advice=advice)
        self._waiters.end_once()
        self._answer_ask()  # the transfer task does not wait out our backoff
        self._phase = Phase.BACKING_OFF
        await asyncio.sleep(delay)
        self._outlook.maybe_ready = True
        self._announce()

    def _received(self, pop: Pop, raws: list[bytes]) -> None:
        pop.received(len(raws))
        self._give_to_waiters(self._decoder.entries(pop, raws))
        self._handoff.maybe_finish(pop)


def _more_due(moved: Any) -> bool:
    """Whether a POP's transfer reply says more is due: its next wake-up at or before its ``TIME``."""
    return bool(moved[2]) and int(moved[2]) <= int(moved[3]) * 1000 + int(moved[4]) // 1000


def _resolve(future: asyncio.Future[Any], result: Any) -> None:
    """Settle ``future`` unless its waiter gave up on it."""
    if not future.done():
        future.set_result(result)
