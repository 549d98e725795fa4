"""Scenario ``lateness_async_for``: the ``lateness`` scenario with the consumer most users write."""

from __future__ import annotations

from typing import Any

from _harness import Bench

from .lateness import lateness


async def run(bench: Bench) -> dict[str, Any]:
    """``async_for_rate`` items/s (20,000) falling due for ``lateness_seconds`` s; one consumer process
    runs ``async for item in queue`` (one item per iteration; the take pump's prefetch serves it), the
    rest as in ``lateness`` (this process produces with ``offer_many``; lateness on the server clock).
    No reference: the bar is absolute (p99 <= 5 ms), judged with the producer on a CPU of its own
    (``_harness.cpu_placement``: why); ``unpinned`` repeats the run with the kernel placing the three
    processes, for the record (no bar)."""
    s = bench.sizes
    out = {"rate": s.async_for_rate, "seconds": s.lateness_seconds,
           "ours": await lateness(bench, "ours_async_for", s.async_for_rate, s.lateness_seconds)}
    if out["ours"]["placement"]["pinned"]:
        out["unpinned"] = await lateness(bench, "ours_async_for", s.async_for_rate, s.lateness_seconds, pin=False)
    return out
