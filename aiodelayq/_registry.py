"""Per event loop and client: the shared subscriber and one refcounted scheduler per queue name."""

from __future__ import annotations

import asyncio
import weakref
from dataclasses import dataclass

from redis.asyncio import Redis

from ._keys import QueueKeys
from ._scheduler import TransferScheduler
from ._scripts import scripts_for
from ._subscriber import Subscriber
from .exceptions import BackendError

__all__ = ["ClientRuntime", "runtime_for"]


@dataclass
class _Entry:
    scheduler: TransferScheduler
    refs: int


class ClientRuntime:
    """What one client shares among its open queues on one event loop."""

    def __init__(self, client: Redis) -> None:
        self.client = client
        self.subscriber = Subscriber(client)
        self._entries: dict[str, _Entry] = {}
        self._lock = asyncio.Lock()

    def scheduler(self, name: str) -> TransferScheduler | None:
        """The running scheduler of queue ``name``, if one is open here."""
        entry = self._entries.get(name)
        return entry.scheduler if entry else None

    async def acquire(self, keys: QueueKeys, *, batch: int, safety_poll_s: float,
                      open_timeout_s: float) -> TransferScheduler:
        """Start (or share) the scheduler of ``keys``; returns once subscribed and transferred once.

        Raises:
            BackendError: the subscription or the first transfer did not succeed in time.
        """
        async with self._lock:
            entry = self._entries.get(keys.destination)
            if entry is not None:
                entry.refs += 1
                return entry.scheduler
            scheduler = TransferScheduler(keys, scripts_for(self.client), batch=batch,
                                          safety_poll_s=safety_poll_s)
            self._entries[keys.destination] = _Entry(scheduler, 1)
            loop = asyncio.get_running_loop()
            deadline = loop.time() + open_timeout_s
            try:
                scheduler.start()
                if not await self.subscriber.add(keys.channel, scheduler, open_timeout_s):
                    raise BackendError(f"could not subscribe to {keys.channel!r} within {open_timeout_s} s")
                if not await scheduler.wait_transferred(max(0.0, deadline - loop.time())):
                    raise BackendError(f"first transfer of {keys.destination!r} failed: "
                                       f"{scheduler.stats.last_error or 'timed out'}")
            except BaseException:
                await self._drop(keys, timeout_s=1.0)
                raise
            return scheduler

    async def release(self, keys: QueueKeys, timeout_s: float) -> None:
        """Drop one reference; the last one stops the scheduler (and the subscriber if idle)."""
        async with self._lock:
            entry = self._entries.get(keys.destination)
            if entry is None:
                return
            entry.refs -= 1
            if entry.refs <= 0:
                await self._drop(keys, timeout_s)

    async def _drop(self, keys: QueueKeys, timeout_s: float) -> None:
        entry = self._entries.pop(keys.destination, None)
        await self.subscriber.remove(keys.channel)
        if entry is not None:
            await entry.scheduler.aclose(timeout_s)
        if not self._entries:
            await self.subscriber.aclose(timeout_s)
            # The registry's value holds the client strongly: forget it so the client can be freed.
            per_loop = _runtimes.get(asyncio.get_running_loop())
            if per_loop is not None and per_loop.get(self.client) is self:
                del per_loop[self.client]


_runtimes: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, weakref.WeakKeyDictionary[Redis, ClientRuntime]]
_runtimes = weakref.WeakKeyDictionary()


def runtime_for(client: Redis) -> ClientRuntime:
    """The runtime of ``client`` on the running event loop (created on first use)."""
    per_loop = _runtimes.setdefault(asyncio.get_running_loop(), weakref.WeakKeyDictionary())
    runtime = per_loop.get(client)
    if runtime is None:
        runtime = per_loop[client] = ClientRuntime(client)
    return runtime
