"""The consumers of one open queue object, as its transfer task sees them.

A transfer task is shared by the queue objects of one client and name; each open one attaches its
:class:`QueueConsumers` (``lifecycle.py`` does, when the queue opens, and detaches them when it
closes). After a transfer, the transfer task tells each what it did (:meth:`QueueConsumers.transferred`);
before one, it offers the transfer to a take pump with waiting callers, whose next POP moves the due
items and pops them in one round trip (:meth:`QueueConsumers.transfer_in_pop`).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from .._consuming.reliable import ReliableConsumer
from .._consuming.take import TakePump

__all__ = ["QueueConsumers"]


@dataclass(frozen=True, eq=False)
class QueueConsumers:
    """One open queue object's take pump and reliable consumer."""

    pump: TakePump
    reliable: ReliableConsumer[Any]

    def transferred(self, ready: int) -> None:
        """A transfer succeeded (or the safety poll read the queue) and ``ready`` items wait in the
        destination list, moved by it or by another process (or Redisson) at the same due time.
        The reliable consumer looks again whatever the list holds: a due time published by another
        process's nack or release concerns the in-flight zset, which the list's length does not
        show. The pump looks when the list has items: an empty one wakes nobody."""
        self.reliable.notify()
        if ready > 0:
            self.pump.notify()

    def transfer_in_pop(self, limit: int) -> asyncio.Future[Any] | None:
        """Let the pump's next POP run the transfer (``limit``: the scripts' transfer argument): its
        future answers ``(sent, received, reply)`` of that POP, or ``None``; ``None`` at once when
        nobody waits to take."""
        return self.pump.ask_transfer(limit)
