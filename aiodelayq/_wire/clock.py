"""An estimate of a Redis server's clock on this process's loop clock (pure state, no I/O).

Scripts get the server time a call was *issued*, so a due time is "server time at the call + delay"
even when the script runs a round trip later. Each reply carrying ``TIME`` bounds the offset: the
estimate is the smallest upper bound seen (never behind the server, so never early); a reply whose
lower bound is above it means the server clock jumped (step, failover), and the estimate restarts.
"""

from __future__ import annotations

import math

__all__ = ["STALE_S", "ServerClock"]

# Seconds: at the 500 ppm an NTP slew may reach, 10 s is 5 ms of drift at most.
STALE_S = 10.0


class ServerClock:
    """The offset between one server's clock (epoch ms) and this loop's clock."""

    def __init__(self) -> None:
        self._offset_ms: float | None = None
        self._at = -math.inf  # loop time of the last reply that bounded it

    def __repr__(self) -> str:
        return f"<ServerClock offset_ms={self._offset_ms} at={self._at:.3f}>"

    def observe(self, sent: float, received: float, server_ms: float) -> None:
        """A reply received at loop time ``received`` to a call sent at ``sent`` read the server
        clock as ``server_ms`` (whole ms, truncated)."""
        upper = server_ms + 1.0 - sent * 1000.0
        lower = server_ms - received * 1000.0
        if self._offset_ms is None or lower > self._offset_ms or received - self._at > STALE_S:
            self._offset_ms = upper
        else:
            self._offset_ms = min(self._offset_ms, upper)
        self._at = received

    def server_ms(self, at: float) -> int | None:
        """The server clock at loop time ``at``, in whole ms truncated as the server's own scripts
        read it, never behind it; ``None`` without a fresh estimate."""
        if self._offset_ms is None or at - self._at > STALE_S:
            return None
        # The truth is strictly below the upper bound: the largest whole ms strictly below it.
        return math.ceil(at * 1000.0 + self._offset_ms) - 1

    def issue_arg(self, at: float) -> int | str:
        """The issue-time script argument: :meth:`server_ms`, or ``""`` (the script uses its own clock)."""
        issued_ms = self.server_ms(at)
        return "" if issued_ms is None else issued_ms
