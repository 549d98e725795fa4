"""The life of a sharded queue object: its shards' lifecycles, opened and closed together.

A shard that fails to open leaves the others open; the next ``open()`` opens the rest.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import fields
from typing import Any

from .._runtime.lifecycle import Lifecycle, QueueStats, State
from ..exceptions import QueueClosedError, QueueNotOpenError
from .fanout import on_every
from .receive import ShardedReceiver
from .record import ShardCount
from .take import ShardedPump

__all__ = ["ShardedLifecycle"]


class ShardedLifecycle:
    """Opens and closes the shards of a sharded queue object together."""

    def __init__(self, name: str, lives: Sequence[Lifecycle], count: ShardCount, *, recheck_s: float) -> None:
        self._name = name
        self._lives = lives
        self._count = count
        self._recheck_s = recheck_s
        self._pump: ShardedPump | None = None
        self._receiver: ShardedReceiver[Any] | None = None
        self._close_task: asyncio.Task[None] | None = None

    def __repr__(self) -> str:
        return f"<ShardedLifecycle {self._name!r} {self.state} shards={len(self._lives)}>"

    @property
    def state(self) -> State:
        """``new`` (or partly open after a failed opening), ``opening``, ``open``, ``closing``, ``closed``."""
        if self._close_task is not None:
            return "closed" if self._close_task.done() else "closing"
        states = {life.state for life in self._lives}
        if states == {"open"} and self._pump is not None:
            return "open"
        return "opening" if "opening" in states else "new"

    def bind_loop(self) -> None:
        """Bind every shard to the running loop (see :meth:`Lifecycle.bind_loop`).

        Raises:
            WrongEventLoopError: the queue belongs to another event loop.
        """
        for life in self._lives:
            life.bind_loop()

    async def enter(self) -> None:
        """What every call of the queue object does first (see :meth:`Lifecycle.enter`).

        Raises:
            WrongEventLoopError, ShardCountError, BackendError: as :meth:`Lifecycle.enter`.
        """
        self.bind_loop()
        if not self._count.passed:
            await self._count.ensure()
            self.bind_loop()  # the shards the check placed, if it placed them again

    def pump(self) -> ShardedPump:
        """The take side of the open queue.

        Raises:
            QueueNotOpenError, QueueClosedError: the queue is not open.
        """
        self.bind_loop()
        state = self.state
        if state == "open" and self._pump is not None:
            return self._pump
        if state in ("closing", "closed"):
            raise QueueClosedError(f"queue {self._name!r} is closed")
        raise QueueNotOpenError(f"queue {self._name!r} is not open: use 'async with queue:' (or 'await queue.open()') "
                                "to consume")

    def reliable(self) -> ShardedReceiver[Any]:
        """The receiving side of the open queue (raises as :meth:`pump`)."""
        self.pump()
        assert self._receiver is not None
        return self._receiver

    def stats(self) -> QueueStats:
        """The shards' counters, summed."""
        each = [life.stats() for life in self._lives]
        return QueueStats(**{f.name: sum(getattr(stats, f.name) for stats in each) for f in fields(QueueStats)})

    async def open(self) -> None:
        """Check the shard count, then open every shard at once; a no-op when open.

        Raises:
            QueueClosedError: closed (or closed while opening); ShardCountError; a shard's opening
                error (the first, once every shard's opening has ended).
        """
        await self.enter()
        if self.state == "open":
            return
        if self._close_task is not None:
            raise QueueClosedError(f"queue {self._name!r} is {self.state}; create a new DelayedQueue")
        await on_every(self._lives, Lifecycle.open)
        if self._close_task is not None:
            raise QueueClosedError(f"queue {self._name!r} was closed while opening")
        if self._pump is None:
            self._pump = ShardedPump(self._name, [life.pump() for life in self._lives], recheck_s=self._recheck_s)
            self._receiver = ShardedReceiver(self._name, [life.reliable() for life in self._lives])

    async def aclose(self) -> None:
        """Close every shard at once, in a task of its own; a cancelled caller stops waiting, the close
        completes (within ``close_timeout_s``). Idempotent."""
        if self._close_task is None:
            self._close_task = asyncio.get_running_loop().create_task(
                self._close(), name=f"aiodelayq-close:{self._name}")
        await asyncio.shield(self._close_task)

    async def _close(self) -> None:
        await on_every(self._lives, Lifecycle.aclose)
