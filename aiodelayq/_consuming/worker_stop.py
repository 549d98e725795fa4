"""How a worker stops its slots: drains them, then cuts off what still runs, and says what became of
each message.

A cut-off handler's message is nacked with no delay (it counts as a delivery: it did start). A
handler still running after its cancellation gets it again every ``_RECANCEL_EVERY_S`` for
``_RECANCEL_FOR_S``: a cancellation can be swallowed where it lands (Python 3.11's
``asyncio.wait_for``, under which redis-py sends commands, returns a result that completes as the
cancellation arrives). A message Redis does not hear about comes back after its visibility timeout.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Collection, Mapping
from typing import Any, Generic, TypeVar

from .._util.clock import reached
from .._util.tasks import run_through_cancellation
from .messages import Message
from .worker_outcomes import Outcomes, WorkerStats, is_last

__all__ = ["CUT_BOUND_S", "Shutdown"]

log = logging.getLogger("aiodelayq")

T = TypeVar("T")
Slot = asyncio.Task[None]

# How long handing back an interrupted message may take (through a forced shutdown's
# cancellations); past it the message comes back after its visibility timeout anyway.
_HAND_BACK_BOUND_S = 1.0
# See the module docstring; a handler still running after _RECANCEL_FOR_S is left running.
_RECANCEL_EVERY_S, _RECANCEL_FOR_S = 0.05, 0.5
CUT_BOUND_S = _RECANCEL_FOR_S + _HAND_BACK_BOUND_S + 0.2
"""The longest a cut takes: the re-cancelling, then a hand-back begun at its end."""


class Shutdown(Generic[T]):
    """Ends the slots of the worker on queue ``name`` (see the module docstring); ``abort`` is set
    by :meth:`Worker.abort`."""

    def __init__(self, name: str, stats: WorkerStats, outcomes: Outcomes[T], abort: asyncio.Event) -> None:
        self._name, self._stats, self._outcomes, self._abort = name, stats, outcomes, abort
        self._cutting = False  # the slots are being cancelled by this worker
        # Slots that are settling a message after its handler ended (handing it back after a cut,
        # or nacking a failure): a cut does not cancel them again. A cut-off slot records what
        # became of its message in `_handed_back` (None: handed back; else why not).
        self._settling: set[Slot] = set()
        self._handed_back: dict[Slot, str | None] = {}

    async def drain(self, slots: Collection[Slot], busy: Mapping[Slot, Message[T] | None],
                    drain_timeout_s: float) -> None:
        """Wait for the slots to finish their handlers until ``drain_timeout_s`` passes or the abort;
        cut off the rest (their messages are handed back)."""
        loop = asyncio.get_running_loop()
        if busy and not self._abort.is_set():
            log.info("worker on %r draining %d running handler(s), up to %.1f s",
                     self._name, len(busy), drain_timeout_s)
        deadline = loop.time() + drain_timeout_s
        abort = loop.create_task(self._abort.wait())
        try:
            while not self._abort.is_set() and not reached(loop.time(), deadline) and not all(t.done() for t in slots):
                await asyncio.wait({*slots, abort}, timeout=deadline - loop.time(),
                                   return_when=asyncio.FIRST_COMPLETED)
        finally:
            abort.cancel()
        await self.cut(slots, busy)

    async def cut(self, slots: Collection[Slot], busy: Mapping[Slot, Message[T] | None]) -> None:
        """Cancel every slot and wait for them (re-cancelling, see the module docstring), then log
        what became of the messages of the handlers that ran."""
        self._cutting = True
        cut = dict(busy)  # the handlers running now, and their messages
        if not slots:
            return
        loop = asyncio.get_running_loop()
        start = loop.time()
        while True:
            running = {task for task in slots if not task.done() and task not in self._settling}
            if not running or loop.time() - start >= _RECANCEL_FOR_S:
                break
            for task in running:
                task.cancel()
            await asyncio.wait(running, timeout=min(_RECANCEL_EVERY_S, start + _RECANCEL_FOR_S - loop.time()))
        pending = {task for task in slots if not task.done()}
        if pending:
            await asyncio.wait(pending, timeout=max(0.0, start + CUT_BOUND_S - loop.time()))
        # Slots still settling what their handler ended with (Redis slow to answer): the settle goes
        # on behind (the settler's call is not cut off with its waiter), the slot stops now.
        late = {task for task in slots
                if not task.done() and task in self._settling and task not in self._handed_back}
        for task in late:
            task.cancel()
        if late:
            await asyncio.wait(late, timeout=0.1)
        for task in slots:
            if task.done() and not task.cancelled() and task.exception() is not None:  # a bug here, not in a handler
                log.error("worker slot failed", exc_info=task.exception())
        self._report(cut)

    def cut_off(self, slot: Slot) -> bool:
        """Whether a ``CancelledError`` in ``slot`` is a stop's (or the caller's, or a forced
        shutdown's), as opposed to one a handler ran into on its own."""
        cancelling = getattr(slot, "cancelling", None)  # Python >= 3.11 counts requests
        if cancelling is not None:
            return bool(cancelling())
        return self._cutting or self._abort.is_set()

    async def settling_in(self, slot: Slot, settling: Awaitable[object]) -> None:
        """Await ``settling``, the settle of ``slot``'s message after its handler ended: a cut does
        not cancel the slot meanwhile (it ends once this is done)."""
        self._settling.add(slot)
        try:
            await settling
        finally:
            self._settling.discard(slot)

    async def interrupted(self, item: Any, message: Message[T] | None) -> None:
        """``item``'s handler was cut off: nack its message with no delay (bounded, through
        cancellations) and record the outcome; plain mode can only say so."""
        me = asyncio.current_task()
        assert me is not None
        self._stats.interrupted += 1
        if message is None:
            self._handed_back[me] = None
            log.error("worker on %r: a handler was cut off by a stop; plain mode (reliable=False) "
                      "cannot hand its item back: %r", self._name, item)
            return
        why: str | None = f"not confirmed within {_HAND_BACK_BOUND_S:.1f} s"
        self._handed_back[me] = why  # until the hand-back is answered

        async def hand_back() -> None:
            nonlocal why
            why = await self._outcomes.settle(message, "nack", 0.0, report=False)

        self._settling.add(me)
        try:
            await run_through_cancellation(hand_back, _HAND_BACK_BOUND_S)
        finally:
            self._settling.discard(me)
            self._handed_back[me] = why

    def _report(self, cut: dict[Slot, Message[T] | None]) -> None:
        """Log what became of ``cut``'s messages: handed back (INFO), not (WARNING, by id), ended on
        their own (INFO), left running (ERROR)."""
        name = self._name
        handed_back = dead = 0
        not_back: list[str] = []
        ended: list[str] = []
        stuck: list[str] = []
        for slot, message in cut.items():
            if slot in self._handed_back:  # ended by the cut's cancellation: counted in stats.interrupted
                why = self._handed_back.pop(slot)
                if message is None:
                    continue  # plain mode: its item was logged at ERROR
                if why is not None:
                    not_back.append(f"{message.id} ({why})")
                elif is_last(message):
                    dead += 1  # its last delivery: the nack dead-lettered it (reason max_deliveries)
                else:
                    handed_back += 1
            elif not slot.done():
                stuck.append(message.id if message is not None else "an item")
            elif message is not None:
                ended.append(message.id)
        self._handed_back.clear()
        cut_off = handed_back + dead + len(not_back)
        if cut_off:
            more = "".join((f", {dead} dead-lettered (it was their last delivery)" if dead else "",
                            f", {len(not_back)} could not be" if not_back else ""))
            log.info("worker on %r cut off %d handler(s): %d message(s) handed back (due again now)%s",
                     name, cut_off, handed_back, more)
        if not_back:
            log.warning("worker on %r could not hand back %d message(s) of cut-off handlers; they come "
                        "back after their visibility timeout: %s", name, len(not_back), ", ".join(not_back))
        if ended:
            log.info("worker on %r: %d handler(s) ended on their own as they were cut off (their messages "
                     "are settled as usual: acked, or nacked as failures): %s", name, len(ended), ", ".join(ended))
        if stuck:
            log.error("worker on %r: %d handler(s) did not stop when cancelled; left running (a message "
                      "comes back after its visibility timeout unless its handler finishes): %s",
                      name, len(stuck), ", ".join(stuck))
