"""A lease for a long job: ``async with msg.lease():`` keeps extending a message's visibility timeout
while the block runs (SQS ``ChangeMessageVisibility`` heartbeats, BullMQ's lock renewal)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from types import TracebackType

from .._util.tasks import keep
from ..exceptions import BackendError, DelayedQueueError

__all__ = ["Lease"]

log = logging.getLogger("aiodelayq")


class Lease:
    """Extends a delivery every ``every_s`` seconds from entry to exit; exit or cancellation stops
    the extending task and waits for it.

    A failed extension is logged (WARNING) and retried next tick. If the message is no longer held,
    ``lost`` becomes ``True``, a WARNING is logged and extending stops; the block is not interrupted.

    Attributes:
        extensions: successful extensions so far.
        lost: the message is no longer held by this delivery.
    """

    def __init__(self, extend: Callable[[float], Awaitable[bool]], *, visibility_timeout_s: float,
                 every_s: float, label: str) -> None:
        self._extend = extend
        self._visibility_timeout_s = visibility_timeout_s
        self._every_s = every_s
        self._label = label
        self._task: asyncio.Future[None] | None = None
        self.extensions = 0
        self.lost = False

    def __repr__(self) -> str:
        running = self._task is not None and not self._task.done()
        return (f"<Lease {self._label} every_s={self._every_s:g} visibility_timeout_s={self._visibility_timeout_s:g} "
                f"extensions={self.extensions} lost={self.lost} running={running}>")

    async def __aenter__(self) -> Lease:
        if self._task is not None:
            raise DelayedQueueError("a lease is entered once: call msg.lease() again")
        self._task = keep(asyncio.get_running_loop().create_task(self._run(), name=f"aiodelayq-lease:{self._label}"))
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        task = self._task
        if task is None or task.done():
            return
        task.cancel()
        # Wait for it to end (an extension in flight is cut off: harmless, its deadline is only
        # later). If this exit is itself cancelled again, the task still ends on its own.
        await asyncio.wait({task})

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._every_s)
            try:
                held = await self._extend(self._visibility_timeout_s)
            except BackendError as exc:
                log.warning("could not extend %s (%s); trying again in %.1f s", self._label, exc,
                            self._every_s)
                continue
            if not held:
                self.lost = True
                log.warning("%s is no longer held (its visibility timeout ended or it was settled); "
                            "the lease stops", self._label)
                return
            self.extensions += 1
