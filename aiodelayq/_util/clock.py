"""Whether a moment of the event loop's clock has come, counted as asyncio counts it for its timers."""

from __future__ import annotations

import time

__all__ = ["SLACK_S", "reached"]

# asyncio runs a timer once the loop's clock is within the clock's resolution of the timer's moment,
# and a simulated clock (looptime's) stops at that moment rounded to its tick. So a task a timer wakes
# can read a time a hair before the moment it aimed at. Waiting again for the hair re-arms a timer that
# runs at once: a spin until the clock ticks, and for ever on a clock that moves only when the loop idles.
SLACK_S = time.get_clock_info("monotonic").resolution + 1e-6


def reached(now: float, when: float) -> bool:
    """Whether loop time ``now`` has reached ``when`` (seconds), give or take :data:`SLACK_S`."""
    return now + SLACK_S >= when
