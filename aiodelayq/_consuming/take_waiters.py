"""The callers waiting on one take pump, in arrival order: each gets at most its max_items of the
items a pop brought, first come first served."""

from __future__ import annotations

import asyncio
import collections
import contextlib
from dataclasses import dataclass
from typing import Any

from .handoff import Pop

__all__ = ["Entry", "Waiter", "Waiters"]

Entry = tuple[Pop, int, Any]
"""A popped item held for a caller: its pop, its index in the pop, and the decoded item."""


@dataclass(eq=False)
class Waiter:
    future: asyncio.Future[list[Entry]]
    max_items: int
    once: bool  # poll without waiting: one pop attempt, then [] if nothing came


class Waiters(collections.deque[Waiter]):
    """The waiting callers of one pump (a deque: the pump's hot path tests it as cheaply as one)."""

    def wanted(self) -> int:
        """How many items the callers still waiting want."""
        while self and self[0].future.done():
            self.popleft()
        return sum(w.max_items for w in self if not w.future.done())

    def serve(self, entries: list[Entry]) -> list[Entry]:
        """Give ``entries`` to the waiters in FIFO order; returns what nobody took."""
        start = 0
        while start < len(entries) and self:
            waiter = self.popleft()
            if waiter.future.done():
                continue
            waiter.future.set_result(entries[start:start + waiter.max_items])
            start += waiter.max_items
        return entries[start:]

    def leave(self, waiter: Waiter) -> list[Entry]:
        """``waiter`` stops waiting: returns the entries already handed to it (for the next waiters)."""
        with contextlib.suppress(ValueError):
            self.remove(waiter)
        future = waiter.future
        if future.done() and not future.cancelled() and future.exception() is None:
            return future.result()
        future.cancel()
        return []

    def end_once(self) -> None:
        """The ``once`` waiters (``poll``) had their one attempt: they get ``[]``."""
        for waiter in list(self):
            if waiter.once and not waiter.future.done():
                self.remove(waiter)
                waiter.future.set_result([])

    def fail(self, exc: BaseException) -> None:
        """The callers waiting now get ``exc`` (a permanent error: later callers try again)."""
        while self:
            waiter = self.popleft()
            if not waiter.future.done():
                waiter.future.set_exception(exc)
                waiter.future.exception()  # retrieved: the caller may be gone
