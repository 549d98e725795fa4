"""How many items one OFFER call may carry: bounded by count, and by the server time calls cost.

A script holds every other client while it runs, and an insert costs several times more on a zset
of millions than on a small one, so no fixed count fits. OFFER returns its own run time;
:class:`CallCost` averages the µs per item and sizes calls to about :data:`BUDGET_US`.
"""

from __future__ import annotations

__all__ = ["BUDGET_US", "MAX_CALL_ITEMS", "MIN_CALL_ITEMS", "CallCost"]

MAX_CALL_ITEMS = 1000  # items per OFFER call, however cheap they are
MIN_CALL_ITEMS = 50  # items per OFFER call, however costly they seem: a list this long is one call
BUDGET_US = 2000  # server time one OFFER call aims at, µs (SLOWLOG's usual threshold is 10 ms)
_WEIGHT = 0.25  # of the newest call in the moving average
_LEARN_FROM = 32  # items: a smaller call's time is mostly its fixed part (call id, reply), not its items
_START_US = 2.0  # µs per item before a call was measured: a small zset's cost


class CallCost:
    """The µs per item of one queue's OFFER calls, and the items the next call may carry."""

    def __init__(self) -> None:
        self._per_item_us = _START_US
        self.max_items = min(MAX_CALL_ITEMS, int(BUDGET_US / _START_US))

    def __repr__(self) -> str:
        return f"<CallCost {self._per_item_us:.2f} µs/item max_items={self.max_items}>"

    def observe(self, items: int, elapsed_us: int) -> None:
        """One call of ``items`` items ran ``elapsed_us`` µs on the server."""
        if items < _LEARN_FROM or elapsed_us < 0:
            return
        self._per_item_us += _WEIGHT * (elapsed_us / items - self._per_item_us)
        fit = int(BUDGET_US / self._per_item_us) if self._per_item_us > 0 else MAX_CALL_ITEMS
        self.max_items = max(MIN_CALL_ITEMS, min(MAX_CALL_ITEMS, fit))
