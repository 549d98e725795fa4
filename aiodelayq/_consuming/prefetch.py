"""Adaptive prefetch, shared by the take pump and the reliable consumer (no I/O).

A fetch asks for :attr:`Prefetch.size` items, so ``async for`` gets the next without a round trip.
The size starts at 1, doubles after a full fetch and halves when prefetched items went back.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable
from typing import TypeVar

from .._util.tracing import tracer

__all__ = ["MAX_PREFETCH", "Prefetch", "PrefetchBuffer"]

E = TypeVar("E")

MAX_PREFETCH = 100
# Bounds of the hold: a loopback round trip can read as ~0 ms (give the loop a turn), and a slow
# one must not keep items from other consumers for long.
_HOLD_MIN_S = 0.001
_HOLD_MAX_S = 0.05


class Prefetch:
    """How many items the next fetch asks for, and how long unclaimed ones may be held."""

    def __init__(self) -> None:
        self.size = 1
        self.round_trip_s = _HOLD_MIN_S

    def __repr__(self) -> str:
        return f"<Prefetch size={self.size} hold_s={self.hold_s:.4f}>"

    @property
    def hold_s(self) -> float:
        """Longest a prefetched item waits for a caller, seconds."""
        return min(_HOLD_MAX_S, max(_HOLD_MIN_S, self.round_trip_s))

    @property
    def saturated(self) -> bool:
        """Whether fetches ask for the most they may (:data:`MAX_PREFETCH`): they came back full."""
        return self.size >= MAX_PREFETCH

    def fetched(self, asked: int, got: int, round_trip_s: float) -> None:
        """A fetch that asked for ``asked`` items got ``got`` in ``round_trip_s`` seconds."""
        self.round_trip_s = round_trip_s
        if got >= asked:
            self.size = min(MAX_PREFETCH, self.size * 2)

    def gave_back(self) -> None:
        """Prefetched items went back unclaimed: fetch fewer."""
        self.size = max(1, self.size // 2)


class PrefetchBuffer(collections.deque[E]):
    """Prefetched entries in fetch order (a deque: ``async for``'s hot path tests it as cheaply as
    one), held :attr:`Prefetch.hold_s` from the first one kept; then, or on :meth:`give_back`,
    ``give_back`` gets all of them and the size halves. :attr:`traced`: whether a tracer provider was
    set when entries were last kept (then they are taken where spans are recorded); read once per
    fetch rather than per item, it costs ``async for`` nothing, and a provider set meanwhile traces
    from the next fetch."""

    def __init__(self, give_back: Callable[[list[E]], None]) -> None:
        super().__init__()
        self.prefetch = Prefetch()
        self.traced = False
        self._hold: asyncio.TimerHandle | None = None
        self._give_back = give_back

    def __repr__(self) -> str:
        return f"<PrefetchBuffer held={len(self)} size={self.prefetch.size}>"

    def take_oldest(self) -> E:
        """The oldest entry (the buffer must not be empty)."""
        entry = self.popleft()
        if not self:
            self._cancel_hold()
        return entry

    def take(self, count: int) -> list[E]:
        """Up to ``count`` of the oldest entries."""
        if count >= len(self):  # all of them: the common case of a caller that keeps up
            taken = list(self)
            self.clear()
        else:
            taken = [self.popleft() for _ in range(count)]
        if not self:
            self._cancel_hold()
        return taken

    def keep(self, entries: list[E]) -> None:
        """Hold ``entries`` for later callers (the hold runs from the first entry kept)."""
        self.extend(entries)
        self.traced = tracer() is not None
        if self and self._hold is None:
            self._hold = asyncio.get_running_loop().call_later(self.prefetch.hold_s, self.give_back)

    def give_back(self) -> None:
        """Nobody came for the entries (or closing): hand all of them to ``give_back``, fetch fewer."""
        self._cancel_hold()  # a no-op when the hold timer itself called this
        if not self:
            return
        entries = list(self)
        self.clear()
        self.prefetch.gave_back()
        self._give_back(entries)

    def _cancel_hold(self) -> None:
        if self._hold is not None:
            self._hold.cancel()
            self._hold = None
