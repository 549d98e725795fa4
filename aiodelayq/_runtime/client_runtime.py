"""The registry of what open queues share, kept weakly by event loop and client:

:class:`ClientRuntime` (per loop and client, while one of its queues is open) holds the subscriber,
one refcounted transfer task per queue name, the safety poll and the call slots; its
:class:`~aiodelayq._util.tasks.TaskOwner` closes with the last queue.

No lock is held across network I/O: each transfer task's start is a future every opener awaits with
its own deadline, so a close never waits for another queue's open.

A runtime's first start sends one ``PING`` so that ``open()`` fails at once when the server cannot
take the client at all (connection refused, or its setup refused); waiting would not change either.
Other failures are left to the retries within ``open_timeout_s``.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from dataclasses import dataclass

from redis.asyncio.cluster import RedisCluster
from redis.exceptions import ResponseError

from .._redis.cluster import is_cluster
from .._redis.connections import AnyRedis, call
from .._scripts import QueueScripts
from .._util.tasks import TaskOwner, stop_task
from .._wire.key_names import QueueKeys
from ..exceptions import BackendError
from .safety_poll import SafetyPoll
from .subscriber import Subscriber
from .transfer_task import TransferTask

__all__ = [
    "CLUSTER_TRANSFER_SLOTS",
    "TRANSFER_SLOTS",
    "ClientRuntime",
    "acquire_transfer_task",
    "release_transfer_task",
    "runtime_for",
]

log = logging.getLogger("aiodelayq")

# Concurrent background calls per client and loop, so pooled connections do not grow with the
# number of queues. A cluster's queues may all live on one node: 3 keeps it at 5 connections
# (with pub/sub and redis-py's slot-map connection).
TRANSFER_SLOTS = 8
CLUSTER_TRANSFER_SLOTS = 3

# Error replies of a passing state: an opening waits these out.
_PASSING = ("LOADING", "BUSY", "MASTERDOWN", "TRYAGAIN", "CLUSTERDOWN")


@dataclass(eq=False)
class _Entry:
    transfer_task: TransferTask
    refs: int
    ready: asyncio.Task[None]


class ClientRuntime:
    """What one client shares among its open queues on one event loop."""

    def __init__(self, client: AnyRedis, *, call_timeout_s: float) -> None:
        self.client = client
        self.tasks = TaskOwner("the shared tasks of a client's queues")
        self.subscriber = Subscriber(client, self.tasks)
        self.entries: dict[str, _Entry] = {}
        self.transfer_slots = asyncio.Semaphore(CLUSTER_TRANSFER_SLOTS if is_cluster(client) else TRANSFER_SLOTS)
        # A single server's queues are polled together; a cluster's each by its own transfer task.
        self.safety_poll = (None if isinstance(client, RedisCluster) else
                            SafetyPoll(client, self.tasks, slots=self.transfer_slots, call_timeout_s=call_timeout_s))
        self.refusal: asyncio.Task[BackendError | None] | None = None

    def __repr__(self) -> str:
        return f"<ClientRuntime queues={len(self.entries)} subscriber={self.subscriber!r} tasks={self.tasks!r}>"

    def transfer_task(self, name: str) -> TransferTask | None:
        """The running transfer task of queue ``name``, if one is open here."""
        entry = self.entries.get(name)
        return entry.transfer_task if entry else None


# Weak in loop and client; a runtime (which holds its client) lives only while a queue is open.
_runtimes: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, weakref.WeakKeyDictionary[AnyRedis, ClientRuntime]]
_runtimes = weakref.WeakKeyDictionary()


def runtime_for(client: AnyRedis) -> ClientRuntime | None:
    """The runtime of ``client`` on the running event loop, if it has open queues."""
    per_loop = _runtimes.get(asyncio.get_running_loop())
    return per_loop.get(client) if per_loop is not None else None


async def _refusal(client: AnyRedis, timeout_s: float) -> BackendError | None:
    """One ``PING``: why the server cannot take this client at all, else ``None``."""
    try:
        await call(client, "PING", what="PING", timeout_s=timeout_s)
    except BackendError as exc:
        reason = _cannot_connect(exc)
        if reason is not None:
            return BackendError(reason, maybe_applied=False)
    return None


def _cannot_connect(exc: BackendError) -> str | None:
    """Why the client cannot connect for a while, per ``exc`` of a ``PING``, else ``None`` (a
    ``PING`` itself is refused only by a passing state or an ACL)."""
    cause = exc.__cause__
    seen: BaseException | None = exc
    for _ in range(8):
        if seen is None:
            break
        if isinstance(seen, ConnectionRefusedError):
            return f"the server refused the connection ({cause or seen})"
        seen = seen.__cause__ or seen.__context__
    if type(exc) is BackendError and isinstance(cause, ResponseError) and not str(cause).startswith(_PASSING):
        return f"the server refused the connection's setup: {cause}"
    return None


async def _start(runtime: ClientRuntime, keys: QueueKeys, transfer_task: TransferTask, timeout_s: float,
                 call_timeout_s: float) -> None:
    """Check once per runtime that the server takes the client, subscribe, transfer once, then join
    the safety poll. Failures until then are the opener's to report."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    if runtime.refusal is None:
        runtime.refusal = runtime.tasks.spawn(_refusal(runtime.client, min(timeout_s, call_timeout_s)),
                                              name="aiodelayq-open-ping", quiet=True)
    probe = runtime.refusal
    await asyncio.wait({probe})  # bounded by its call's timeout
    refused = None if probe.cancelled() else probe.result()  # cancelled: the runtime is closing
    if refused is not None:
        raise BackendError(f"opening {keys.destination!r} failed at once: {refused}") from refused
    transfer_task.start()
    if not await runtime.subscriber.add(keys.channel, transfer_task, timeout_s):
        raise BackendError(f"could not subscribe to {keys.channel!r} within {timeout_s} s: "
                           f"{runtime.subscriber.last_error or 'no confirmation'}")
    if not await transfer_task.wait_transferred(max(0.0, deadline - loop.time())):
        raise BackendError(f"first transfer of {keys.destination!r} failed: "
                           f"{transfer_task.stats.last_error or 'timed out'}")
    if runtime.safety_poll is not None:
        runtime.safety_poll.add(transfer_task)


def _progress(runtime: ClientRuntime, keys: QueueKeys, transfer_task: TransferTask) -> str:
    """What an opening that ran out of time still waits for, and the last failure in its way."""
    if not runtime.subscriber.subscribed(keys.channel):
        return f"not subscribed to {keys.channel!r} ({runtime.subscriber.last_error or 'no confirmation'})"
    return f"no transfer succeeded ({transfer_task.stats.last_error or 'none finished'})"


async def acquire_transfer_task(client: AnyRedis, keys: QueueKeys, *, batch: int, safety_poll_s: float,
                            open_timeout_s: float, call_timeout_s: float,
                            lag_warning_s: float | None = None) -> TransferTask:
    """Start (or share) the transfer task of ``keys`` on ``client``; returns once subscribed and
    transferred once. A cancelled caller drops its reference.

    Raises:
        BackendError: the server refused the connection or its setup (at once), or the
            subscription or the first transfer did not succeed in time (or failed with a permanent
            error such as a missing permission).
    """
    loop = asyncio.get_running_loop()
    per_loop = _runtimes.setdefault(loop, weakref.WeakKeyDictionary())
    runtime = per_loop.get(client)
    if runtime is None:
        runtime = per_loop[client] = ClientRuntime(client, call_timeout_s=call_timeout_s)
    entry = runtime.entries.get(keys.destination)
    if entry is None:
        transfer_task = TransferTask(QueueScripts(client, keys, call_timeout_s=call_timeout_s), runtime.tasks,
                                      batch=batch, safety_poll_s=safety_poll_s, slots=runtime.transfer_slots,
                                      shared_poll=runtime.safety_poll is not None, lag_warning_s=lag_warning_s)
        ready = runtime.tasks.spawn(_start(runtime, keys, transfer_task, open_timeout_s, call_timeout_s),
                                    name=f"aiodelayq-open:{keys.destination}", quiet=True)
        entry = runtime.entries[keys.destination] = _Entry(transfer_task, 0, ready)
    entry.refs += 1
    try:
        done, _ = await asyncio.wait({entry.ready}, timeout=open_timeout_s)
        if not done:
            raise BackendError(f"opening {keys.destination!r} did not finish within {open_timeout_s} s: "
                               f"{_progress(runtime, keys, entry.transfer_task)}")
        entry.ready.result()  # its failure: raised here, to every opener, and reported by them alone
    except BaseException:
        await release_transfer_task(client, keys, timeout_s=1.0)
        raise
    return entry.transfer_task


async def release_transfer_task(client: AnyRedis, keys: QueueKeys, timeout_s: float) -> None:
    """Drop one reference; the last one stops the transfer task (and the subscriber if idle), within
    ``timeout_s``."""
    runtime = runtime_for(client)
    entry = runtime.entries.get(keys.destination) if runtime else None
    if runtime is None or entry is None:
        return
    entry.refs -= 1
    if entry.refs > 0:
        return
    # Decided before any await: a later open() starts afresh, and of many queues closing together
    # exactly one closes the subscriber.
    del runtime.entries[keys.destination]
    last = not runtime.entries
    if last:
        per_loop = _runtimes.get(asyncio.get_running_loop())
        if per_loop is not None and per_loop.get(client) is runtime:
            del per_loop[client]
    else:
        runtime.subscriber.remove(keys.channel)
    if runtime.safety_poll is not None:
        runtime.safety_poll.discard(entry.transfer_task)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    if entry.ready.done():  # its outcome went to its openers (acquire_transfer_task raised a failure)
        if not entry.ready.cancelled() and entry.ready.exception() is not None:
            log.debug("opening of %r failed: %s", keys.destination, entry.ready.exception())
    else:
        await stop_task(entry.ready, max(0.0, deadline - loop.time()))
    await entry.transfer_task.aclose(max(0.0, deadline - loop.time()))
    if last:  # the subscriber and the safety poll first (they release their connections), then the rest
        if runtime.safety_poll is not None:
            await runtime.safety_poll.aclose(max(0.0, deadline - loop.time()))
        await runtime.subscriber.aclose(max(0.0, deadline - loop.time()))
        await runtime.tasks.aclose(deadline)
