"""The leased hand-off of the take pump: its pops, until Redis has forgotten them.

Once every item of a pop is settled, FINISH removes its entry with the plan of each item. A pop
whose items were all handed out needs no plan, so the next POP forgets it (one round trip less);
without a POP within a round trip, FINISH does. The next POP awaits a FINISH that gives items back
(:meth:`Handoff.returns_landed`), so it never pops later items first. What remains after closing
goes back to the head of the destination when the lease ends.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from .._redis.retry import resend_within, retry_until_done
from .._scripts import QueueScripts
from .._util.clock import reached
from .._util.tasks import TaskOwner, wait_through_cancellation
from ..exceptions import BackendError

__all__ = ["HANDOFF_LEASE_MS", "Handoff", "Pop", "Popped", "payloads"]

log = logging.getLogger("aiodelayq")

# How long popped items may stay in the hand-off before any opener returns them to the queue. A
# live pump finishes an entry within a round trip; a pump cut off for longer loses its claim.
HANDOFF_LEASE_MS = 20_000
# A pop whose reply was lost is resent with the same call id (which returns the same items) for at
# most this long; then it is given up with FINISH '*', and the lease covers the rest.
_RESEND_HORIZON_S = 10.0


@dataclass(eq=False)
class Pop:
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

    def settle(self, index: int, verdict: str, stop: int | None = None) -> None:
        """Record ``verdict`` for item ``index`` (for items ``index`` to ``stop - 1`` with ``stop``)."""
        if stop is None:
            if self.plan[index] is None:
                self.undecided -= 1
            self.plan[index] = verdict
            return
        self.undecided -= self.plan[index:stop].count(None)
        self.plan[index:stop] = [verdict] * (stop - index)

    @property
    def settled(self) -> bool:
        return self.size >= 0 and self.undecided == 0


class Popped(NamedTuple):
    """What one POP brought: ``moved`` is the transfer's reply (``None``: none ran), ``hold`` the
    controls' (see POP), ``expired`` how many popped items had expired (dead-lettered by POP)."""

    pop: Pop
    moved: Any
    hold: int
    expired: int
    items: list[bytes]


def payloads(bare: int | bytes, header: int | bytes, items: list[bytes]) -> list[bytes]:
    """A POP reply's items as payloads: the first ``bare`` are; the rest are fast elements handed out
    whole, each with its payload after ``header`` bytes (the script never makes those payloads)."""
    bare = int(bare)
    if bare >= len(items):
        return items
    header = int(header)
    return items[:bare] + [raw[header:] for raw in items[bare:]]


class Handoff:
    """The unfinished pops of one take pump (see the module docstring)."""

    def __init__(self, scripts: QueueScripts, tasks: TaskOwner, *, slots: asyncio.Semaphore,
                 hold_s: Callable[[], float], closing: Callable[[], bool]) -> None:
        self._scripts, self._keys, self._slots, self._tasks = scripts, scripts.keys, slots, tasks
        self._call_timeout_s = scripts.call_timeout_s
        self._hold_s = hold_s  # how long a handed-out pop may wait for the next POP
        self._closing = closing  # the pump is closing: no more deferring, FINISH at once
        self.pops: dict[Pop, None] = {}  # popped and not yet finished in Redis, oldest first
        self._done: dict[Pop, None] = {}  # all handed out: forgotten by the next POP
        self._done_timer: asyncio.TimerHandle | None = None
        self._returning: set[asyncio.Future[Any]] = set()  # FINISHes that give items back
        self._first: asyncio.Future[Any] | None = None  # see return_first

    def __repr__(self) -> str:
        return (f"<Handoff {self._keys.destination!r} unfinished={len(self.pops)} done={len(self._done)} "
                f"returning={len(self._returning)}>")

    def new_pop(self) -> Pop:
        """A pop with a fresh call id, unfinished from now on (see :meth:`pop`)."""
        pop = Pop(os.urandom(16))
        self.pops[pop] = None
        return pop

    async def pop(self, count: int, transfer: int, *, top_up: bool = False, pop: Pop | None = None) -> Popped:
        """POP up to ``count`` items, forgetting :meth:`take_done`'s pops and transferring up to
        ``|transfer|`` elements first (``_util.observe.transfer_limit``); ``top_up`` (a backlog
        drain): the list's items first, then only the items still wanted are moved. Moved items it
        pops skip the list. Unfinished from the start (a flush meanwhile sends FINISH '*'); resent
        with the same id for ``_RESEND_HORIZON_S``.

        ``pop``: one of :meth:`new_pop` to use. Cancelled, it FINISHes the pops it was to forget (it
        may not have landed).

        Raises:
            BackendError: still failing at the horizon, or a final error (what it may have got is
                returned by FINISH '*'; the forgotten pops are FINISHed).
        """
        pop = pop or self.new_pop()
        done = self.take_done()
        for earlier in done:
            earlier.finish_attempts += 1  # a FINISH after it must not read "found nothing" as a lost lease
        forget = [earlier.call_id for earlier in done]
        k = self._keys

        async def attempt(remaining_s: float, _resend: bool) -> Popped:
            async with self._slots:
                reply: list[Any] = await self._scripts.pop(
                    pop.call_id, count, HANDOFF_LEASE_MS, transfer, "1" if top_up else "0", *forget,
                    timeout_s=min(remaining_s, self._call_timeout_s), what=f"pop from {k.destination!r}")
            return Popped(pop, reply[0], int(reply[1]), int(reply[2]), payloads(*reply[3:]))

        try:
            popped = await resend_within(attempt, timeout_s=_RESEND_HORIZON_S)
        except (BackendError, asyncio.CancelledError) as exc:
            for earlier in done:  # idempotent, whether or not the POP forgot them
                self._finish_soon(earlier)
            # Cancelled, the pop itself stays unfinished: a flush, or its owner, FINISHes it.
            if isinstance(exc, BackendError):
                if exc.maybe_applied:
                    self.maybe_finish(pop, unknown=True)  # return whatever it got
                else:
                    self.pops.pop(pop, None)
            raise
        for earlier in done:
            self.pops.pop(earlier, None)
        if not popped.items:
            self.pops.pop(pop, None)  # an empty pop records nothing
        return popped

    @property
    def returning(self) -> bool:
        """Whether FINISHes that give items back are in flight."""
        return bool(self._returning)

    async def returns_landed(self) -> None:
        """Wait for the FINISHes that give items back (each try bounded by ``call_timeout_s``)."""
        if self._returning:
            await asyncio.wait(set(self._returning), timeout=self._call_timeout_s)

    def maybe_finish(self, pop: Pop, *, unknown: bool = False) -> None:
        """Send FINISH once every item of ``pop`` is settled (``unknown``: no reply came, so FINISH '*'
        returns whatever it got, or makes a late pop pop nothing)."""
        if pop.finishing is not None or not (unknown or pop.settled) or pop not in self.pops:
            return
        if not unknown and not self._closing() and pop.plan.count("d") == len(pop.plan):
            if pop not in self._done:
                self._done[pop] = None
                if self._done_timer is None:
                    self._done_timer = asyncio.get_running_loop().call_later(self._hold_s(),
                                                                             self._finish_done)
            return
        self._finish_soon(pop)
        if "r" in pop.plan or unknown:
            self._returned(pop)

    def _returned(self, pop: Pop) -> None:
        """``pop``'s FINISH gives items back: the next POP waits for it, and so does every FINISH
        started after it (see :meth:`_finish_soon`)."""
        assert pop.finishing is not None
        self._first = pop.finishing
        self._returning.add(pop.finishing)
        pop.finishing.add_done_callback(self._returning.discard)

    def take_done(self) -> list[Pop]:
        """The pops whose items were all handed out, for the next POP to forget (or, closing, the
        flush to FINISH); their FINISH timer is cancelled."""
        if self._done_timer is not None:
            self._done_timer.cancel()
            self._done_timer = None
        done = list(self._done)
        self._done.clear()
        return done

    def _finish_done(self) -> None:
        """No POP came within a round trip: FINISH the handed-out pops on their own."""
        for pop in self.take_done():
            self._finish_soon(pop)

    def _finish_soon(self, pop: Pop, popping: asyncio.Future[Any] | None = None) -> None:
        """FINISH ``pop`` in a task of its own (owned: ``flush`` waits for it, or starts it again),
        after the last FINISH that gives items back: those go to the head of the list, so of two
        pops given back, the later one's must go first, and land first, for the order to hold; and
        after ``popping``, its POP's task, when given."""
        pop.finishing = self._tasks.spawn(self._finish_after(self._landing(), pop, popping=popping),
                                          name="aiodelayq-finish")

    def _landing(self) -> asyncio.Future[Any] | None:
        """The last FINISH that gives items back, while it has not landed."""
        return self._first if self._first is not None and not self._first.done() else None

    async def _finish_after(self, first: asyncio.Future[Any] | None, pop: Pop, deadline: float = math.inf, *,
                            popping: asyncio.Future[Any] | None = None) -> None:
        if popping is not None:
            await asyncio.wait({popping})  # (bounded: a POP is resent within _RESEND_HORIZON_S)
            if not popping.cancelled():
                popping.exception()  # retrieved: its failure, if any, was handled where it was raised
            if pop not in self.pops:
                return  # it popped nothing, or failed unapplied: nothing to return
        if first is not None:
            await asyncio.wait({first})
        await self.finish(pop, deadline)

    def return_first(self, pop: Pop, popping: asyncio.Future[Any] | None = None) -> None:
        """Return all ``pop`` got (FINISH '*': a read-ahead nobody reads, which may have popped items
        behind items about to be given back) before any FINISH started after this call; with
        ``popping`` (its POP's task, left to run), once that ended: a FINISH that overtook its POP
        would leave a tombstone in the hand-off until the lease ends."""
        if pop not in self.pops or pop.finishing is not None:
            return  # it failed unapplied, or is being finished
        self._finish_soon(pop, popping)
        self._returned(pop)

    async def finish(self, pop: Pop, deadline: float = math.inf) -> None:
        """FINISH ``pop``, tried again until done (it is idempotent) or ``deadline`` (loop time)."""
        plan = "*" if pop.size < 0 else "".join(v or "r" for v in pop.plan)
        if not plan:  # an empty pop records nothing
            self.pops.pop(pop, None)
            return
        k = self._keys

        async def attempt(timeout_s: float) -> Any:
            async with self._slots:
                pop.finish_attempts += 1
                return await self._scripts.finish(pop.call_id, plan, HANDOFF_LEASE_MS, timeout_s=timeout_s,
                                                  what=f"finish a pop from {k.destination!r}")

        try:
            done = await retry_until_done(attempt, per_try_s=self._call_timeout_s, deadline=deadline)
        except BackendError as exc:
            # Given up for good (a permanent error, or the close deadline): not tried again.
            self.pops.pop(pop, None)
            log.warning("could not finish a pop from %r (%s); the lease returns its items",
                        k.destination, exc)
            return
        self.pops.pop(pop, None)
        if not done and pop.finish_attempts == 1 and "d" in plan:
            # Found nothing, and no earlier FINISH of this pop may have been applied: the lease ran
            # out and the items went back.
            log.warning("a pop from %r outlived its %d ms lease; its items went back to the queue "
                        "and may be delivered twice", k.destination, HANDOFF_LEASE_MS)

    async def flush(self, deadline: float) -> bool:
        """Settle every unfinished pop ('r' for undecided items) and FINISH them until ``deadline``,
        restarting FINISH tasks a forced shutdown cancels; returns whether this task was cancelled
        meanwhile (the caller raises it)."""
        loop = asyncio.get_running_loop()
        started: set[asyncio.Future[Any]] = set()
        cancelled = False
        self.take_done()  # still in self.pops: FINISHed below
        while self.pops and not reached(loop.time(), deadline):
            pending: set[asyncio.Future[Any]] = set()
            before = self._landing()
            for pop in reversed(list(self.pops)):  # the latest first, one after another: see _finish_soon
                for index, verdict in enumerate(pop.plan):
                    if verdict is None:
                        pop.settle(index, "r")
                if pop.finishing is None or pop.finishing.done():
                    pop.finishing = self._tasks.spawn(self._finish_after(before, pop, deadline),
                                                      name="aiodelayq-finish")
                pending.add(pop.finishing)
                before = pop.finishing
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
