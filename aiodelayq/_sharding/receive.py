"""``receive``/``receive_many``/``messages`` (and reliable workers) over the K reliable consumers of a
sharded queue.

A shard that had nothing is skipped until its future is done or its wait is up, so waiting on K idle shards
does not cost K RECEIVEs per call. A shard whose RECEIVE failed is skipped for ``_FAILED_SKIP_S``; a call that
found nothing raises that failure, as an ordinary queue's would. A message is settled on its own shard.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from .._consuming.messages import Message
from .._consuming.reliable import ReliableConsumer
from .._consuming.traced import traced_receive
from .._consuming.wait_loop import Look, WaitLoop
from .._redis.connections import is_permanent
from .._util.clock import reached
from .._util.tracing import tracer
from ..exceptions import BackendError
from .layout import Rotation

__all__ = ["ShardedReceiver"]

T = TypeVar("T")

_FAILED_SKIP_S = 1.0


@dataclass
class _Quiet:
    """A shard that had nothing at its last look: skipped until ``wake`` is done or ``until`` (loop time)."""

    wake: asyncio.Future[None]
    until: float


class ShardedReceiver(Generic[T]):
    """Receives messages of all shards (see the module docstring)."""

    def __init__(self, name: str, consumers: Sequence[ReliableConsumer[T]]) -> None:
        self._name = name
        self._consumers = list(consumers)
        self._rotation = Rotation(len(self._consumers))
        self._quiet: list[_Quiet | None] = [None] * len(self._consumers)
        self._waits = WaitLoop()

    def __repr__(self) -> str:
        return f"<ShardedReceiver {self._name!r} shards={len(self._consumers)}>"

    async def receive_many(self, max_items: int, vt_ms: int, timeout_s: float | None, *,
                           traced: bool = True) -> list[Message[T]]:
        """Up to ``max_items`` messages, waiting up to ``timeout_s`` (``None``: forever) for at least
        one; ``[]`` after. Traced as :meth:`ReliableConsumer.receive_many`.

        Raises:
            QueueClosedError: the queue was closed. BackendError: a shard's RECEIVE failed and no
                other shard had messages.
        """
        if traced and (found := tracer()) is not None:
            return await traced_receive(found, self._name, self.receive_many(max_items, vt_ms, timeout_s, traced=False))
        return await self._waits.run(lambda _woken: self._look(max_items, vt_ms), timeout_s)

    async def _look(self, max_items: int, vt_ms: int) -> Look[Message[T]]:
        """One look at each shard that may have messages, in rotation (so none starves), until one gives
        some; those are topped up only with what other shards received ahead, never with a round trip, so
        the call holds messages only where it cannot be interrupted (a cancelled look undoes its RECEIVE).
        Found nothing: the quiet shards' futures and how long until the first is looked at again.

        Raises:
            BackendError: the first transient failure met, when no shard had messages.
        """
        loop = asyncio.get_running_loop()
        failure: BackendError | None = None
        order = self._rotation.order()
        for index in order:
            quiet = self._quiet[index]
            if quiet is not None and not quiet.wake.done() and not reached(loop.time(), quiet.until):
                continue
            try:
                messages, wake, wait_s = await self._consumers[index].look(max_items, vt_ms)
            except BackendError as exc:
                if is_permanent(exc):
                    raise
                failure = failure or exc
                self._quiet[index] = _Quiet(loop.create_future(), loop.time() + _FAILED_SKIP_S)
                continue
            if not messages:
                self._quiet[index] = _Quiet(wake, loop.time() + wait_s)
                continue
            self._quiet[index] = None
            for other in order:  # what others received ahead: no round trip, nothing suspends
                consumer = self._consumers[other]
                if len(messages) < max_items and consumer.prefetched(vt_ms):
                    messages += (await consumer.look(max_items - len(messages), vt_ms))[0]
            return messages, set(), 0.0
        if failure is not None:
            raise failure
        quiets = [quiet for quiet in self._quiet if quiet is not None]  # others may have looked meanwhile
        wait_s = max(0.0, min((quiet.until for quiet in quiets), default=loop.time()) - loop.time())
        return [], {quiet.wake for quiet in quiets}, wait_s
