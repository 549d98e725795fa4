"""The pub/sub side: one connection per client and event loop, serving every open queue."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any, Protocol, cast

from redis.asyncio.cluster import RedisCluster
from redis.exceptions import RedisClusterException, RedisError

from .._redis.backoff import Backoff
from .._redis.cluster import mark_stale
from .._redis.connections import AnyRedis, classify, is_permanent
from .._util.tasks import TaskOwner, detached, stop_task, timeout
from ..exceptions import BackendError

__all__ = ["ChannelListener", "Subscriber"]

log = logging.getLogger("aiodelayq")


class ChannelListener(Protocol):
    """What a transfer task exposes to the subscriber."""

    def on_subscribed(self) -> None:
        """The channel was (re)subscribed: run a compensating transfer."""

    def on_due(self, due_ms: int | None) -> None:
        """A new earliest due time (epoch ms, server clock) was published; ``None`` if unreadable."""

    def room(self) -> None:
        """A wake-up for consumers, with nothing due, was published (``+`` and the server ms)."""


class Subscriber:
    """Owns one ``PubSub`` of a client and a reader task that dispatches to channel listeners.

    Every ``subscribe`` confirmation calls the listener's ``on_subscribed`` (Redisson's "transfer on
    subscribe" compensation). The reader pings an idle connection every ``ping_interval_s`` and
    reconnects when it stops answering, so a half-open connection cannot silence a queue for long.
    """

    def __init__(self, client: AnyRedis, tasks: TaskOwner, *, ping_interval_s: float = 30.0) -> None:
        self._client = client
        self._tasks = tasks
        self._ping_interval_s = ping_interval_s
        self._listeners: dict[bytes, ChannelListener] = {}
        self._confirmed: dict[bytes, asyncio.Event] = {}
        self._pubsub: Any = None
        # Serialises (un)subscribe calls: PubSub connects lazily and two concurrent first calls
        # could each take a connection from the pool.
        self._lock = asyncio.Lock()
        # Set after each subscribe an add() makes: a reader whose PubSub had no connection (every
        # channel refused) reads again once one may have connected it.
        self._subscribed = asyncio.Event()
        self._task = tasks.supervise("aiodelayq-subscriber", self._run, restart_after_s=1.0,
                                    wanted=lambda: bool(self._listeners))
        self._leaving: set[bytes] = set()
        self._unsubscriber: asyncio.Task[None] | None = None
        # A subscribe that fails for good is handed to add()'s waiters: open() raises it at once.
        self._openers: dict[bytes, asyncio.Future[BackendError]] = {}
        self.reconnects = 0
        self.last_error: str | None = None

    def __repr__(self) -> str:
        return f"<Subscriber channels={len(self._listeners)} reconnects={self.reconnects} task={self._task!r}>"

    @property
    def channels(self) -> int:
        """How many channels this subscriber serves."""
        return len(self._listeners)

    def subscribed(self, channel: str) -> bool:
        """Whether the server confirmed a subscription to ``channel`` since it was added."""
        return self._is_confirmed(channel.encode())

    def _is_confirmed(self, key: bytes) -> bool:
        confirmed = self._confirmed.get(key)
        return confirmed is not None and confirmed.is_set()

    async def add(self, channel: str, listener: ChannelListener, timeout_s: float) -> bool:
        """Subscribe ``listener`` to ``channel``; return whether the server confirmed within ``timeout_s``.

        When it did not, the reader keeps retrying in the background; the caller decides (until a
        channel is confirmed, the reader logs its failures at DEBUG only: the caller reports them).

        Raises:
            AccessDeniedError: the server refused the subscription; a missing channel permission
                names the channel and the ACL rule that grants it.
            WrongNodeError: another permanent failure of the subscription.
        """
        key = channel.encode()
        self._listeners[key] = listener
        self._leaving.discard(key)
        confirmed = self._confirmed[key] = asyncio.Event()
        failed = self._openers[key] = asyncio.get_running_loop().create_future()
        self._task.start()  # unless running; the reader subscribes every listener when it connects
        subscribing = asyncio.ensure_future(self._subscribe(key, confirmed))
        waits: set[asyncio.Future[Any]] = {subscribing, failed}
        try:
            await asyncio.wait(waits, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if self._openers.get(key) is failed:
                del self._openers[key]
            await stop_task(subscribing, 0.1, report=False)  # its subscribe call is detached
        if confirmed.is_set():
            return True
        if failed.done():
            raise failed.result()
        return False

    async def _subscribe(self, key: bytes, confirmed: asyncio.Event) -> None:
        if not confirmed.is_set():
            async with self._lock:
                if self._pubsub is not None and not confirmed.is_set():
                    try:
                        await detached(self._pubsub.subscribe(key))
                    # As in _unsubscribe: redis-py may raise non-Redis errors mid-reconnect.
                    except Exception as exc:
                        # The reader sees the same broken connection, reconnects and resubscribes all.
                        log.debug("subscribe %r failed, the reader will retry: %r", key, exc)
                    finally:
                        self._subscribed.set()
        await confirmed.wait()

    def remove(self, channel: str, timeout_s: float = 1.0) -> None:
        """Stop dispatching ``channel`` now; unsubscribe it in the background within ``timeout_s``
        (best effort; channels removed together share one ``UNSUBSCRIBE``)."""
        key = channel.encode()
        self._listeners.pop(key, None)
        self._confirmed.pop(key, None)
        if not self._listeners:
            return  # the owner closes the whole subscriber next
        self._leaving.add(key)
        if self._unsubscriber is None or self._unsubscriber.done():
            self._unsubscriber = self._tasks.spawn(self._unsubscribe_leaving(timeout_s), name="aiodelayq-unsubscribe")

    async def _unsubscribe_leaving(self, timeout_s: float) -> None:
        with contextlib.suppress(asyncio.TimeoutError):
            async with timeout(timeout_s):
                await self._unsubscribe_all()

    async def _unsubscribe_all(self) -> None:
        while self._leaving:
            async with self._lock:
                keys, self._leaving = self._leaving, set()
                if self._pubsub is None:
                    continue  # the reader subscribes only the listeners when it connects
                try:
                    await detached(self._pubsub.unsubscribe(*keys))
                # redis-py can also fail here with non-Redis errors while its connection is being
                # re-established (AttributeError on a closed writer); nothing else runs in this try.
                except Exception as exc:
                    log.debug("unsubscribe of %d channel(s) failed: %r", len(keys), exc)

    async def aclose(self, timeout_s: float) -> None:
        """Stop the reader and release its connection; idempotent."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        self._leaving.clear()
        unsubscriber, self._unsubscriber = self._unsubscriber, None
        await stop_task(unsubscriber, timeout_s, report=False)  # the connection goes with the reader anyway
        await self._task.stop(max(0.0, deadline - loop.time()))

    async def _run(self) -> None:
        backoff = Backoff("pub/sub connection")
        while True:
            pubsub = await self._new_pubsub()
            try:
                async with self._lock:
                    self._pubsub = pubsub
                    if self._listeners:
                        await pubsub.subscribe(*self._listeners)
                backoff.succeeded()
                await self._read(pubsub)
            except (RedisError, RedisClusterException, OSError) as exc:  # the last: a cluster's slot map
                self.reconnects += 1
                if isinstance(self._client, RedisCluster):
                    mark_stale(self._client)  # its node may be gone: the next data call reads the map
                # The channels never confirmed (their queues are opening) are the ones a refusal
                # of a channel is about: the others were allowed when they subscribed.
                opening = [key for key in self._listeners if not self._is_confirmed(key)]
                error = classify("subscribe", exc, sent=True,
                                 channels=[key.decode() for key in opening or self._listeners])
                self.last_error = str(error)
                handed = is_permanent(error) and self._hand_to_openers(opening, error)
                # Quiet while the openers report it (every channel opening, or handed to them).
                await asyncio.sleep(backoff.failed(error, quiet=handed or len(opening) == len(self._listeners)))
            finally:
                self._pubsub = None
                # reset() closes the connection; shielded so a cancelled reader still releases it.
                await asyncio.shield(cast(Any, pubsub).aclose())

    def _hand_to_openers(self, channels: list[bytes], error: BackendError) -> bool:
        """Give ``error`` to :meth:`add`'s waiters for ``channels`` and drop those channels, so the
        next reconnect subscribes only the others; whether one was handed."""
        handed = False
        for key in channels:
            waiter = self._openers.get(key)
            if waiter is not None and not waiter.done():
                waiter.set_result(error)
                self._listeners.pop(key, None)
                self._confirmed.pop(key, None)
                handed = True
        return handed

    async def _new_pubsub(self) -> Any:
        """A ``PubSub`` of the client. On a cluster any node hears every channel (``PUBLISH`` is
        broadcast), so one connection serves every queue; each reconnect takes the next node."""
        client = self._client
        if not isinstance(client, RedisCluster):
            return client.pubsub()
        try:
            await client.initialize()
        except (RedisError, RedisClusterException, OSError):
            return client.pubsub()  # its first subscribe fails the same way and the reader retries
        nodes = client.get_primaries() + client.get_replicas()
        return client.pubsub(node=nodes[self.reconnects % len(nodes)]) if nodes else client.pubsub()

    async def _read(self, pubsub: Any) -> None:
        loop = asyncio.get_running_loop()
        ping_sent_at: float | None = None
        last_seen = loop.time()
        while True:
            if pubsub.connection is None:
                # Nothing subscribed: every channel was refused (handed to its opener). The next add()
                # subscribes here, which connects it; until then there is nothing to read.
                self._subscribed.clear()
                await self._subscribed.wait()
                last_seen = loop.time()
                continue
            message = await pubsub.get_message(timeout=self._ping_interval_s)
            now = loop.time()
            if message is None:
                if ping_sent_at is not None and now - ping_sent_at >= self._ping_interval_s:
                    raise ConnectionError("pub/sub connection did not answer PING")
                if ping_sent_at is None and now - last_seen >= self._ping_interval_s:
                    await pubsub.ping()
                    ping_sent_at = now
                continue
            last_seen = now
            ping_sent_at = None
            try:
                self._dispatch(message)
            except Exception:  # synchronous listener code: a bug there must not end the reader
                log.exception("could not dispatch pub/sub message %r", message)

    def _dispatch(self, message: dict[str, Any]) -> None:
        kind = message.get("type")
        channel = message.get("channel")
        if not isinstance(channel, bytes):
            return
        listener = self._listeners.get(channel)
        if listener is None:
            return
        if kind == "subscribe":
            event = self._confirmed.get(channel)
            if event is not None:
                event.set()
            listener.on_subscribed()
        elif kind == "message":
            data = message.get("data")
            if isinstance(data, bytes) and data[:1] == b"+":  # aiodelayq's wake-up: nothing fell due
                listener.room()
            else:
                listener.on_due(_parse_due(data))


_MAX_DUE_MS = 2**53


def _parse_due(data: object) -> int | None:
    # Redisson publishes the due time with LongCodec (decimal text). Anything else, or a number no
    # due time can be, just wakes the transfer task, whose transfer then reads the true head.
    try:
        due = int(data) if isinstance(data, (bytes, str)) and len(data) <= 20 else None
    except ValueError:
        return None
    return due if due is not None and -_MAX_DUE_MS < due < _MAX_DUE_MS else None
