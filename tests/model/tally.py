"""What a run did, counted for its summary (``tests/test_model.py`` prints it) and for Hypothesis's
statistics."""

from __future__ import annotations

from collections import Counter

from hypothesis import event

__all__ = ["STATS", "tally"]

STATS: Counter[str] = Counter()


def tally(what: str, *, quiet: bool = False) -> None:
    """Count ``what`` (``quiet``: only in the summary, not as a Hypothesis event)."""
    STATS[what] += 1
    if not quiet:
        event(what)
