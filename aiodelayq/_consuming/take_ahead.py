"""The take pump's read-ahead: the next POP goes out before the last one's items are decoded.

While a backlog drains and the callers keep up, the client decoding one pop's items and the server
popping the next run at once instead of in turn. A read-ahead's pop is unfinished from the start, like
any other (``handoff.py``): a close that drops it returns what it got.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, NamedTuple

from .._redis.exchange import until_written, writing
from .._util.tasks import TaskOwner
from .handoff import Handoff, Pop, Popped

__all__ = ["Ahead", "Backlog", "ReadAhead"]

Backlog = tuple[int, Callable[[float, float, Any], object]]
"""While a backlog drains: a POP's transfer limit, and where its reply goes ``(sent, received, reply)``."""


class Ahead(NamedTuple):
    """A read-ahead POP: its pop, task, item count (size), loop time sent, and the backlog transfer
    it carries (or ``None``)."""

    pop: Pop
    task: asyncio.Task[Popped]
    size: int
    sent: float
    backlog: Backlog | None


class ReadAhead:
    """At most one read-ahead POP of one pump."""

    def __init__(self, handoff: Handoff, tasks: TaskOwner, name: str, *, wake: asyncio.Event) -> None:
        self._handoff, self._tasks, self._name, self._wake = handoff, tasks, name, wake
        self.ahead: Ahead | None = None

    def __repr__(self) -> str:
        return f"<ReadAhead {self._name!r} ahead={self.ahead is not None}>"

    @property
    def done(self) -> bool:
        """Whether a read-ahead's reply (or failure) is in."""
        return self.ahead is not None and self.ahead.task.done()

    async def send(self, count: int, backlog: Backlog | None) -> None:
        """Send a POP of ``count`` items (transferring ``backlog[0]`` first when given), and return
        once it is written (or failed, or after a few loop turns). Its end sets the pump's wake-up."""
        loop = asyncio.get_running_loop()
        written: asyncio.Future[None] = loop.create_future()
        pop = self._handoff.new_pop()
        popping = self._handoff.pop(count, backlog[0] if backlog else 0, top_up=backlog is not None, pop=pop)
        task = self._tasks.spawn(writing(written, popping),
                                 quiet=True, name=f"aiodelayq-take-ahead:{self._name}")
        self.ahead = Ahead(pop, task, count, loop.time(), backlog)
        task.add_done_callback(lambda _: self._wake.set())
        await until_written(written, task)

    def take(self) -> Ahead | None:
        """The read-ahead in flight (or done), now the pump's to await; ``None`` when there is none."""
        ahead, self.ahead = self.ahead, None
        return ahead

    def drop(self) -> Pop | None:
        """Stop the read-ahead, unread: returns its pop (unfinished: the flush, or the caller, FINISHes
        it with '*', which returns what it got), or ``None`` when there is none."""
        ahead, self.ahead = self.ahead, None
        if ahead is None:
            return None
        if not ahead.task.done():
            ahead.task.cancel()
        elif not ahead.task.cancelled():
            ahead.task.exception()  # retrieved: a failure matters to nobody now
        return ahead.pop
