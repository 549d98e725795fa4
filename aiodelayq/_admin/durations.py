"""A duration as people read it, for the command line's tables and the dashboard's pages."""

from __future__ import annotations

import math

__all__ = ["format_duration"]


def format_duration(ms: float | None) -> str:
    """A duration for people: ``340 ms``, ``4.2 s``, ``3 min 05 s``, ``2 h 05 min``, ``3 d 4 h`` (``-``
    for ``None``)."""
    if ms is None or not math.isfinite(ms):
        return "-"
    ms = abs(ms)
    if ms < 1000:
        return f"{ms:.0f} ms"
    s = ms / 1000
    if s < 60:
        return f"{s:.1f} s"
    s_int = int(s)
    if s_int < 3600:
        return f"{s_int // 60} min {s_int % 60:02d} s"
    if s_int < 86400:
        return f"{s_int // 3600} h {s_int % 3600 // 60:02d} min"
    return f"{s_int // 86400} d {s_int % 86400 // 3600} h"

