"""The consumers of one open queue object, as its transfer task sees them.

Each open queue object attaches its :class:`QueueConsumers` to the shared transfer task
(``lifecycle.py``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
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
        """A transfer succeeded, or the safety poll read the queue and found items ready (it calls
        this only then), and ``ready`` items wait. The reliable consumer looks whatever the list
        holds: another process's nack concerns the in-flight zset, which ``ready`` does not show."""
        self.reliable.notify()
        if ready > 0:
            self.pump.notify()

    def room(self) -> None:
        """Room was made without a transfer (see :meth:`TransferTask.room`): both look again."""
        self.reliable.notify()
        self.pump.notify()

    def transfer_in_pops(self, limit: int, report: Callable[[float, float, Any], object]) -> None:
        """While a backlog drains, the pump's POPs transfer first (see :meth:`TakePump.transfer_in_pops`)."""
        self.pump.transfer_in_pops(limit, report)

    def transfer_in_pop(self, limit: int) -> asyncio.Future[Any] | None:
        """Let the pump's next POP run the transfer (see :meth:`TakePump.ask_transfer`)."""
        return self.pump.ask_transfer(limit)
