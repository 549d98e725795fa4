"""Adaptive prefetch, shared by the take pump and the reliable consumer (pure state, no I/O).

A fetch asks for up to :attr:`Prefetch.size` items even when the waiting callers want fewer, so a
caller that takes one item at a time (``async for``) gets the next one without a round trip. The
size starts at 1 (no prefetch), doubles after a fetch that came back full (more may be ready), and
halves when prefetched items had to go back. Items nobody came for are kept at most one round trip
(the latest fetch's, within the bounds below), then given back.
"""

from __future__ import annotations

__all__ = ["MAX_PREFETCH", "Prefetch"]

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

    def fetched(self, asked: int, got: int, round_trip_s: float) -> None:
        """A fetch that asked for ``asked`` items got ``got`` in ``round_trip_s`` seconds."""
        self.round_trip_s = round_trip_s
        if got >= asked:
            self.size = min(MAX_PREFETCH, self.size * 2)

    def gave_back(self) -> None:
        """Prefetched items went back unclaimed: fetch fewer."""
        self.size = max(1, self.size // 2)
