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

__all__ = ["ClientRuntime", "acquire_scheduler", "release_scheduler", "runtime_for"]


@dataclass
class _Entry:
    scheduler: TransferScheduler
    refs: int


class ClientRuntime:
    """What one client shares among its open queues on one event loop."""

    def __init__(self, client: Redis) -> None:
        self.client = client
        self.subscriber = Subscriber(client)
        self.entries: dict[str, _Entry] = {}
        self.transfer_slots = asyncio.Semaphore(8)

    def scheduler(self, name: str) -> TransferScheduler | None:
        """The running scheduler of queue ``name``, if one is open here."""
        entry = self.entries.get(name)
        return entry.scheduler if entry else None


# Both maps are weak in the loop and the client; a runtime exists only while one of its queues is
# open (its value holds the client strongly), the lock for as long as the client lives, so an
# open() racing the last aclose() always finds the runtime the other one registered.
_runtimes: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, weakref.WeakKeyDictionary[Redis, ClientRuntime]]
_runtimes = weakref.WeakKeyDictionary()
_locks: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, weakref.WeakKeyDictionary[Redis, asyncio.Lock]]
_locks = weakref.WeakKeyDictionary()


def runtime_for(client: Redis) -> ClientRuntime | None:
    """The runtime of ``client`` on the running event loop, if it has open queues."""
    per_loop = _runtimes.get(asyncio.get_running_loop())
    return per_loop.get(client) if per_loop is not None else None


def _lock_for(client: Redis) -> asyncio.Lock:
    per_loop = _locks.setdefault(asyncio.get_running_loop(), weakref.WeakKeyDictionary())
    lock = per_loop.get(client)
    if lock is None:
        lock = per_loop[client] = asyncio.Lock()
    return lock


async def acquire_scheduler(client: Redis, keys: QueueKeys, *, batch: int, safety_poll_s: float,
                            open_timeout_s: float) -> TransferScheduler:
    """Start (or share) the scheduler of ``keys`` on ``client``; returns once subscribed and
    transferred once.

    Raises:
        BackendError: the subscription or the first transfer did not succeed in time.
    """
    async with _lock_for(client):
        loop = asyncio.get_running_loop()
        per_loop = _runtimes.setdefault(loop, weakref.WeakKeyDictionary())
        runtime = per_loop.get(client)
        if runtime is None:
            runtime = per_loop[client] = ClientRuntime(client)
        entry = runtime.entries.get(keys.destination)
        if entry is not None:
            entry.refs += 1
            return entry.scheduler
        scheduler = TransferScheduler(keys, scripts_for(client), batch=batch, safety_poll_s=safety_poll_s,
                                      slots=runtime.transfer_slots)
        runtime.entries[keys.destination] = _Entry(scheduler, 1)
        deadline = loop.time() + open_timeout_s
        try:
            scheduler.start()
            if not await runtime.subscriber.add(keys.channel, scheduler, open_timeout_s):
                raise BackendError(f"could not subscribe to {keys.channel!r} within {open_timeout_s} s")
            if not await scheduler.wait_transferred(max(0.0, deadline - loop.time())):
                raise BackendError(f"first transfer of {keys.destination!r} failed: "
                                   f"{scheduler.stats.last_error or 'timed out'}")
        except BaseException:
            await _drop(runtime, keys, timeout_s=1.0)
            raise
        return scheduler


async def release_scheduler(client: Redis, keys: QueueKeys, timeout_s: float) -> None:
    """Drop one reference; the last one stops the scheduler (and the subscriber if idle)."""
    async with _lock_for(client):
        runtime = runtime_for(client)
        entry = runtime.entries.get(keys.destination) if runtime else None
        if runtime is None or entry is None:
            return
        entry.refs -= 1
        if entry.refs <= 0:
            await _drop(runtime, keys, timeout_s)


async def _drop(runtime: ClientRuntime, keys: QueueKeys, timeout_s: float) -> None:
    entry = runtime.entries.pop(keys.destination, None)
    await runtime.subscriber.remove(keys.channel)
    if entry is not None:
        await entry.scheduler.aclose(timeout_s)
    if not runtime.entries:
        await runtime.subscriber.aclose(timeout_s)
        per_loop = _runtimes.get(asyncio.get_running_loop())
        if per_loop is not None and per_loop.get(runtime.client) is runtime:
            del per_loop[runtime.client]
