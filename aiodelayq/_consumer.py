"""The consuming side: pops due payloads for this queue object's waiting ``take``/``poll`` calls.

redis-py drops a connection whose read is cancelled, so a ``BLPOP`` cancelled after the server
popped would lose the item. Callers therefore never await Redis themselves: one pump task owns a
dedicated connection and pops only while callers wait; a caller that gives up just leaves the
queue of waiters. An item that arrives for nobody (its caller left between the pop and the reply)
goes to the next waiter or back to the head of the destination list.

Pops and push-backs go straight to a connection, never through ``Redis.execute_command``: its
automatic retry would resend a pop whose reply was lost (losing that item) or a push whose reply
was lost (duplicating it) without telling anyone.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from collections.abc import Awaitable
from typing import Any, TypeVar, cast

from redis.asyncio import Redis
from redis.exceptions import RedisError

from ._tasks import RETRY_BACKOFF, stop_task

__all__ = ["TakePump"]

log = logging.getLogger("aiodelayq")

T = TypeVar("T")

# Extra client-side patience for a BLPOP reply beyond its server-side timeout: a server that is
# briefly stalled is not a dead connection.
_BLPOP_MARGIN_S = 5.0


class TakePump:
    """Serves raw payloads of ``key`` to waiters in FIFO order.

    ``block_s`` is each ``BLPOP``'s server-side timeout; the client waits ``block_s`` plus a margin
    for the reply whatever the client's ``socket_timeout``. ``aclose()`` wakes a blocked ``BLPOP``
    with ``CLIENT UNBLOCK`` instead of cancelling the read, so closing loses nothing either.
    """

    def __init__(self, client: Redis, key: str, *, block_s: float = 5.0) -> None:
        self._client = client
        self._pool: Any = client.connection_pool
        self._key = key
        self._block_s = block_s
        # Each waiter wants up to ``capacity`` items and gets a non-empty list.
        self._waiters: collections.deque[tuple[asyncio.Future[list[bytes]], int]] = collections.deque()
        self._demand = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._side_tasks: set[asyncio.Future[Any]] = set()
        self._conn: Any = None
        self._conn_id: int | None = None
        self._blocking = False
        self._closed: BaseException | None = None
        self.returned = 0

    async def get(self, timeout_s: float | None, max_items: int = 1) -> list[bytes]:
        """Wait up to ``timeout_s`` seconds (``None``: forever) for 1 to ``max_items`` payloads; ``[]`` on
        timeout.

        Raises the exception given to :meth:`fail_waiters` once the pump is closing, and the
        caller's own ``asyncio.CancelledError`` without losing a popped item.
        """
        if self._closed is not None:
            raise self._closed
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[list[bytes]] = loop.create_future()
        entry = (waiter, max_items)
        self._waiters.append(entry)
        self._demand.set()
        if self._task is None:
            self._start()
        try:
            await asyncio.wait({waiter}, timeout=timeout_s)
        except BaseException:
            # The caller's own cancellation. Items delivered in the same loop turn are handed on.
            if waiter.done() and not waiter.cancelled() and waiter.exception() is None:
                self.give_back(waiter.result())
            self._forget(entry)
            raise
        if not waiter.done():
            self._forget(entry)
            return []
        return waiter.result()

    def _start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name=f"aiodelayq-take:{self._key}")
        self._task.add_done_callback(self._pump_done)

    def _pump_done(self, task: asyncio.Task[None]) -> None:
        # The pump ends by closing or cancellation; an unexpected error (redis-py can raise
        # non-Redis errors mid-reconnect) must not leave waiters hanging: log and start it again.
        if task.cancelled() or task is not self._task or self._closed is not None:
            return
        log.error("aiodelayq: take pump of %r died; restarting", self._key, exc_info=task.exception())
        self._task = None
        if self._waiters:
            asyncio.get_running_loop().call_later(0.1, self._restart)

    def _restart(self) -> None:
        if self._task is None and self._closed is None:
            self._start()

    def _forget(self, entry: tuple[asyncio.Future[list[bytes]], int]) -> None:
        entry[0].cancel()
        with contextlib.suppress(ValueError):  # ValueError: already taken by the pump
            self._waiters.remove(entry)

    async def pop_nowait(self, max_items: int = 1) -> list[bytes]:
        """Up to ``max_items`` payloads that are ready now (``LPOP key count``); cancellation-safe.

        Raises:
            RedisError: the pop failed (it is not retried: a resent pop could lose an item).
        """
        if self._closed is not None:
            raise self._closed
        task: asyncio.Future[Any] = self.spawn(self._command("LPOP", self._key, max_items))
        try:
            items: list[bytes] | None = await asyncio.shield(task)
        except asyncio.CancelledError:
            task.add_done_callback(self._give_back_result)
            raise
        return items or []

    def fail_waiters(self, exc: BaseException) -> None:
        """Close for callers: wake every waiter with ``exc`` and raise it from later calls."""
        self._closed = exc
        while self._waiters:
            waiter, _ = self._waiters.popleft()
            if not waiter.done():
                waiter.set_exception(exc)

    def give_back(self, items: list[bytes]) -> None:
        """Hand ``items`` to current waiters, or push them back to the head of the list, in order."""
        rest = self._deliver(items)
        if rest:
            self.returned += len(rest)
            self.spawn(self._push_back(rest))

    def spawn(self, work: Awaitable[T]) -> asyncio.Future[T]:
        """Run ``work`` as a task owned by the pump: callers cannot cancel it, ``aclose`` awaits it."""
        task = asyncio.ensure_future(work)
        self._side_tasks.add(task)
        task.add_done_callback(self._side_tasks.discard)
        return task

    async def write_with_retry(self, what: str, *command: Any, attempts: int = 20) -> None:
        """Send ``command`` until it succeeds, with backoff; after ``attempts`` failures log at ERROR
        that the data is lost and raise the last error.

        A failure whose reply was lost may have been applied: the retry then writes twice
        (at-least-once), which is the right side to err on for data that must not be lost.
        """
        failures = 0
        while True:
            try:
                await self._command(*command)
                return
            except (RedisError, OSError) as exc:
                failures += 1
                if failures >= attempts:
                    log.error("aiodelayq: could not %s after %d attempts (%r); the data is lost", what, failures, exc)
                    raise
                await asyncio.sleep(RETRY_BACKOFF.compute(failures))

    async def aclose(self, timeout_s: float) -> None:
        """Stop popping, wake the blocked ``BLPOP`` and wait for returned items to be pushed back.

        Returns within about ``timeout_s``: half of it for ``CLIENT UNBLOCK`` to end the ``BLPOP``
        cleanly, then the pump is cancelled, then side tasks (push-backs) get the rest.
        """
        if self._closed is None:
            self._closed = ConnectionError("pump closed")
        self._demand.set()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        unblock_until = loop.time() + timeout_s / 2
        task = self._task
        while task is not None and not task.done() and loop.time() < unblock_until:
            if self._blocking and self._conn_id is not None:
                unblock = self.spawn(self._command("CLIENT", "UNBLOCK", self._conn_id))
                await asyncio.wait({unblock}, timeout=max(0.0, unblock_until - loop.time()))
                if not unblock.done():
                    await stop_task(cast(asyncio.Task[Any], unblock), 0.1)
                elif not unblock.cancelled() and unblock.exception() is not None:
                    log.debug("aiodelayq: CLIENT UNBLOCK failed: %r", unblock.exception())
            await asyncio.wait({task}, timeout=min(0.05, max(0.0, unblock_until - loop.time())))
        stopped = await stop_task(task, max(0.1, deadline - loop.time()))
        while self._side_tasks and loop.time() < deadline:
            await asyncio.wait(set(self._side_tasks), timeout=max(0.0, deadline - loop.time()))
        for side in list(self._side_tasks):
            log.error("aiodelayq: %r did not finish within the close bound", side)
            await stop_task(cast(asyncio.Task[Any], side), 0.1)
        if self._conn is not None:
            conn, self._conn = self._conn, None
            conn.deregister_connect_callback(self._on_connect)
            if not stopped:
                await conn.disconnect(nowait=True)  # a read may still be pending on it
            await self._pool.release(conn)

    # -- internals -------------------------------------------------------------------------------

    async def _command(self, *args: Any) -> Any:
        """One command on a pooled connection, with no automatic retry."""
        conn = await self._pool.get_connection()
        try:
            await conn.send_command(*args)
            return await conn.read_response()
        finally:
            await self._pool.release(conn)

    def _deliver(self, items: list[bytes]) -> list[bytes]:
        """Hand ``items`` to waiters in FIFO order; return what nobody wanted."""
        start = 0
        while start < len(items) and self._waiters:
            waiter, capacity = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(items[start:start + capacity])
                start += capacity
        return items[start:]

    def _wanted(self) -> int:
        """How many items the live waiters want in all."""
        while self._waiters and self._waiters[0][0].done():
            self._waiters.popleft()
        return sum(capacity for waiter, capacity in self._waiters if not waiter.done())

    def _give_back_result(self, task: asyncio.Future[Any]) -> None:
        if not task.cancelled() and task.exception() is None and task.result():
            self.give_back(list(task.result()))

    async def _push_back(self, items: list[bytes]) -> None:
        # LPUSH inserts one by one at the head: reversed keeps the original order.
        await self.write_with_retry(f"return {len(items)} popped item(s) to {self._key!r}",
                                    "LPUSH", self._key, *reversed(items))

    async def _connection(self) -> Any:
        if self._conn is None:
            self._conn = await self._pool.get_connection()
            self._conn.register_connect_callback(self._on_connect)
            await self._on_connect(self._conn)
        elif not self._conn.is_connected:
            await self._conn.connect()  # runs _on_connect
        return self._conn

    async def _on_connect(self, conn: Any) -> None:
        # CLIENT ID of this very connection lets aclose() wake its BLPOP with CLIENT UNBLOCK.
        await conn.send_command("CLIENT", "ID", check_health=False)
        self._conn_id = int(await conn.read_response())

    async def _run(self) -> None:
        failures = 0
        while self._closed is None:
            wanted = self._wanted()
            if wanted == 0:
                self._demand.clear()
                await self._demand.wait()
                continue
            try:
                items = await self._pop(wanted)
            except (RedisError, OSError) as exc:
                failures += 1
                delay = RETRY_BACKOFF.compute(failures)
                log.warning("aiodelayq: BLPOP on %r failed (%r); retrying in %.2f s", self._key, exc, delay)
                await asyncio.sleep(delay)
                continue
            failures = 0
            if items:
                self.give_back(items)

    async def _pop(self, wanted: int) -> list[bytes]:
        conn = await self._connection()
        self._blocking = True
        try:
            await conn.send_command("BLPOP", self._key, self._block_s)
            reply = await conn.read_response(timeout=self._block_s + _BLPOP_MARGIN_S)
        finally:
            self._blocking = False
        if reply is None:
            return []
        items = [reply[1]]
        if wanted > 1 and self._closed is None:
            try:
                await conn.send_command("LPOP", self._key, wanted - 1)
                more = await conn.read_response()
            except BaseException:
                self.give_back(items)  # popped already: never drop it with the error
                raise
            if more:
                items.extend(more)
        return items
