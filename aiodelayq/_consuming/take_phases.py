"""The phases of the take pump's loop, and what the pump knows of its list that decides them.

The pump (:class:`~aiodelayq._consuming.take.TakePump`) is in one phase at a time; its loop asks
:meth:`Outlook.next_phase` for the next one after every step::

    IDLE ──(a wake-up: a waiter, a transfer, items given back, the transfer task's ask)──► POP
    POP ──(full: more may be there)──► POP          POP ──(short: the list is empty)──► IDLE
    POP ──(the controls refused)──► HELD ──(the hold is over)──► POP
    POP ──(failed, transient)──► BACKING_OFF ──(the backoff is over)──► POP
    SERVE (waiters and prefetched items both, not expected) ──► whatever the waiters leave

Closing ends the loop from any phase.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Callable

from .._util.clock import reached
from .controls import hold_s

__all__ = ["DRAINED_FOR_S", "Outlook", "Phase"]

# After a short pop, a waiter arriving within this long does not pop by itself: every way items
# reach the list through the queue wakes the pump anyway, and `async for` would otherwise send an
# empty POP after every transfer. Items pushed by other code are seen at most this much later.
DRAINED_FOR_S = 0.05


class Phase(enum.Enum):
    """What the take pump's loop does now."""

    IDLE = "idle"  # nobody waits, or nothing may be in the list: wait for a wake-up
    SERVE = "serve"  # callers wait while prefetched items are kept: hand the items out
    POP = "pop"  # pop for the waiters (transferring first if the transfer task asked)
    HELD = "held"  # the queue's controls refused the last POP: wait out their hold
    BACKING_OFF = "backing off"  # the last POP failed: wait out the backoff


class Outlook:
    """What a take pump knows of its list between pops: its next phase and how much it pops."""

    def __init__(self) -> None:
        self.maybe_ready = True  # something said items may be in the list since the last pop began
        self.drained_at: float | None = None  # loop time of the latest short pop (see DRAINED_FOR_S)
        # After a refused POP: no POP before this loop time, whatever wakes the pump.
        self.held_until: float | None = None
        self.limited = False  # the last POP met the rate limit: pop only what callers want
        self.recheck: asyncio.TimerHandle | None = None  # see recheck_later

    def __repr__(self) -> str:
        return (f"<Outlook maybe_ready={self.maybe_ready} drained_at={self.drained_at} "
                f"held_until={self.held_until} limited={self.limited}>")

    def next_phase(self, wanted: int, buffered: bool, asked: bool, now: float) -> Phase:
        """The pump's next phase (``now``: loop time)."""
        if wanted and buffered:  # not expected: callers take from the buffer first
            return Phase.SERVE
        if wanted == 0 or not (self.maybe_ready or asked):
            return Phase.IDLE
        if self.held_until is not None and not reached(now, self.held_until):
            return Phase.HELD
        return Phase.POP

    def items_may_be_there(self) -> None:
        """Something says items may be in the list: the next waiter pops."""
        self.maybe_ready = True
        self.drained_at = None

    def just_drained(self, now: float) -> bool:
        """A pop found the list empty less than ``DRAINED_FOR_S`` before ``now``, nothing announced since."""
        return self.drained_at is not None and not reached(now, self.drained_at + DRAINED_FOR_S)

    @property
    def drained(self) -> bool:
        """The last pop came back short and nothing announced items since."""
        return self.drained_at is not None and not self.maybe_ready

    def held_s(self, now: float) -> float:
        """Seconds from ``now`` (loop time) until the controls let the pump pop again (0: not held)."""
        return 0.0 if self.held_until is None or reached(now, self.held_until) else self.held_until - now

    def popping(self) -> None:
        """A POP begins: what is said from now on may be after it."""
        self.maybe_ready = False
        self.held_until = None

    def popped(self, asked: int, got: int, expired: int, hold: int, received: float) -> None:
        """A POP's outcome (``hold``: see POP; ``received``: loop time of its reply)."""
        self.limited = hold > 0
        if hold:  # the controls refused some or all: ask again later, not at the next wake-up
            self.held_until = received + hold_s(hold)
            self.maybe_ready = True
        elif got + expired < asked and not self.maybe_ready:  # the list was empty, nothing said since
            self.drained_at = received
        if got + expired >= asked or (expired and not got):
            self.maybe_ready = True  # there may be more (after expired items too)

    def recheck_later(self, loop: asyncio.AbstractEventLoop, rechecked: Callable[[], None]) -> None:
        """Call ``rechecked`` once the drain is ``DRAINED_FOR_S`` old (a set timer covers it)."""
        if self.recheck is None:
            assert self.drained_at is not None
            self.recheck = loop.call_at(self.drained_at + DRAINED_FOR_S, self._rechecked, rechecked)

    def _rechecked(self, rechecked: Callable[[], None]) -> None:
        self.recheck = None
        rechecked()

    def cancel_recheck(self) -> None:
        if self.recheck is not None:
            self.recheck.cancel()
            self.recheck = None
