"""The queues of an application (:class:`Queues`) for a web app's lifespan, with no framework imported.

Everything is created at open, in the running event loop (the client and queues belong to it). Workers
drain before the queues close because their handlers still need the queue and the client. A closed group
can be opened again (a test client per test), with a new client and new queue objects.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from anyio.abc import AsyncResource
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.backoff import AbstractBackoff

from ._consuming.handler import check_handler
from ._consuming.worker_slots import Worker
from ._options import WorkerOptions
from ._queue import DelayedQueue
from ._util.tasks import TaskOwner, timeout
from ._wire.key_names import QueueKeys
from .exceptions import ConfigurationError, QueueNotOpenError

__all__ = ["Queues"]

log = logging.getLogger("aiodelayq")

# What cutting a worker off takes at most: its slots hand their messages back within about 1 s.
_CUT_OFF_S = 2.5

AnyClient = Redis | RedisCluster
State = Literal["new", "opening", "open", "closing"]


@dataclass
class _Declared:
    options: dict[str, Any]
    workers: list[tuple[Callable[[Any], Awaitable[object]], WorkerOptions]] = field(default_factory=list)


class Queues(AsyncResource):
    """A Redis client and the queues (and in-process workers) of an application.

    >>> queues = Queues("redis://localhost:6379/0")
    >>> queues.add("orders:cancel-unpaid", codec="json")
    >>> app = FastAPI(lifespan=queues.lifespan)          # aiohttp: app.cleanup_ctx.append(queues.cleanup_ctx)
    >>> await queues["orders:cancel-unpaid"].offer(order, delay=timedelta(minutes=30))

    Args:
        redis: a URL (a client is made with ``Redis.from_url(url, **redis_options)`` at each open and
            closed at each close), a zero-argument function returning a client (idem), or a client
            (used as is, never closed here: its owner closes it).
        close_timeout_s: bound of :meth:`aclose`, seconds: workers drain within their own
            ``drain_timeout_s`` and this bound less 2.5 s; then they are cut off (their messages
            handed back); then each queue closes within its own ``close_timeout_s`` and the
            client within what is left (at least 0.5 s).
        redis_options: keyword arguments for ``Redis.from_url`` (``decode_responses`` must stay off).

    Raises:
        ConfigurationError: ``redis`` is none of those.
    """

    def __init__(self, redis: str | AnyClient | Callable[[], AnyClient], *, close_timeout_s: float = 30.0,
                 **redis_options: Any) -> None:
        if not (isinstance(redis, (str, Redis, RedisCluster)) or callable(redis)):
            raise ConfigurationError(f"redis must be a URL, a client or a function returning one, not {redis!r}")
        self._redis, self._redis_options = redis, redis_options
        self.close_timeout_s = close_timeout_s
        self._declared: dict[str, _Declared] = {}
        self._client: AnyClient | None = None
        self._queues: dict[str, DelayedQueue[Any]] = {}
        self._workers: list[tuple[Worker[Any], asyncio.Task[None]]] = []
        self.state: State = "new"
        self._closing: asyncio.Task[None] | None = None
        self._tasks = TaskOwner("workers of Queues")  # the workers' run tasks; a new one per open
        self._opened = asyncio.Event()  # set when an open() ends, either way

    def __repr__(self) -> str:
        return (f"<Queues {self.state} queues={sorted(self._declared)} "
                f"workers={sum(len(d.workers) for d in self._declared.values())}>")

    def add(self, name: str, **options: Any) -> None:
        """Declare the queue ``name`` with :class:`DelayedQueue` keyword ``options`` (created at
        open). Declaring a name again with the same options is a no-op.

        Raises:
            ConfigurationError: the name is declared with other options, or the group is open.
            InvalidNameError: an empty or non-``str`` name; with a ``RedisCluster`` client, a name
                whose keys do not all hash to one slot (a client made at open is checked then).
        """
        self._check_new("add a queue")
        self._check_name(name)
        known = self._declared.get(name)
        if known is not None and known.options != options:
            raise ConfigurationError(f"queue {name!r} is already declared with other options")
        if known is None:
            self._declared[name] = _Declared(dict(options))

    def add_worker(self, name: str, handler: Callable[[Any], Awaitable[object]], *, concurrency: int = 16,
                   visibility_timeout_s: float = 30.0, reliable: bool = True, drain_timeout_s: float = 30.0,
                   retry_backoff: AbstractBackoff | None = None) -> None:
        """Run a worker of ``handler`` (:class:`WorkerOptions`) on the queue ``name`` while the group
        is open (the queue is declared with default options if it was not). See
        :meth:`DelayedQueue.consume` for what the worker does with each item.

        Raises:
            ConfigurationError: the group is open, a bad option (named), or a handler that is not an
                async callable (see :meth:`DelayedQueue.consume`).
            InvalidNameError: as :meth:`add`.
        """
        self._check_new("add a worker")
        self._check_name(name)
        options = WorkerOptions.of(locals())
        self._declared.setdefault(name, _Declared({})).workers.append((check_handler(handler), options))

    def _check_name(self, name: str) -> None:
        QueueKeys.for_name(name, cluster=isinstance(self._redis, RedisCluster))

    def _check_new(self, what: str) -> None:
        if self.state != "new":
            raise ConfigurationError(f"cannot {what} to open Queues: declare everything before opening")

    @property
    def is_open(self) -> bool:
        """Whether the client and queues exist now."""
        return self.state == "open"

    @property
    def client(self) -> AnyClient:
        """The Redis client (while open).

        Raises:
            QueueNotOpenError: the group is not open.
        """
        if self._client is None or self.state != "open":
            raise QueueNotOpenError("Queues is not open: use it inside the app's lifespan (or 'async with queues:')")
        return self._client

    @property
    def workers(self) -> list[Worker[Any]]:
        """The workers running now (their ``stats``, ``state``, ``running``)."""
        return [worker for worker, _ in self._workers]

    def __getitem__(self, name: str) -> DelayedQueue[Any]:
        """The queue ``name`` (while open).

        Raises:
            QueueNotOpenError: the group is not open. ConfigurationError: ``name`` was not declared.
        """
        self.client  # noqa: B018 - raises unless open
        queue = self._queues.get(name)
        if queue is None:
            raise ConfigurationError(f"queue {name!r} was not declared (Queues.add)")
        return queue

    def dependency(self, name: str) -> Callable[[], DelayedQueue[Any]]:
        """A FastAPI dependency handing a handler the queue ``name``:
        ``q: Annotated[DelayedQueue[dict], Depends(queues.dependency("orders"))]`` (and
        ``app.dependency_overrides`` can replace it in tests)."""
        if name not in self._declared:
            raise ConfigurationError(f"queue {name!r} was not declared (Queues.add)")

        def queue() -> DelayedQueue[Any]:
            return self[name]

        queue.__name__ = f"aiodelayq_queue_{name}"
        return queue

    @contextlib.asynccontextmanager
    async def lifespan(self, app: object = None) -> AsyncIterator[None]:
        """``FastAPI(lifespan=queues.lifespan)`` / Starlette: open for the app's life. It yields no
        lifespan state (servers without state support refuse one); handlers reach the queues
        through this object or :meth:`dependency`."""
        async with self:
            yield

    async def cleanup_ctx(self, app: object) -> AsyncIterator[None]:
        """``app.cleanup_ctx.append(queues.cleanup_ctx)`` (aiohttp): open for the app's life."""
        async with self:
            yield

    async def open(self) -> Queues:
        """Make the client and the queues, open the queues that have workers and start them.

        Raises:
            ConfigurationError: already open. BackendError, AccessDeniedError: a worker's queue
                could not be opened (everything made so far is closed again).
        """
        if self.state != "new":
            raise ConfigurationError(f"Queues is {self.state}; close it before opening it again")
        self.state = "opening"
        self._opened = asyncio.Event()
        self._tasks = TaskOwner("workers of Queues")
        try:
            client = self._make_client()
            self._client = client
            self._queues = {name: DelayedQueue(client, name, **d.options) for name, d in self._declared.items()}
            for name, declared in self._declared.items():
                if declared.workers:
                    await self._queues[name].open()
                for handler, options in declared.workers:
                    worker = Worker(self._queues[name], handler, options)
                    task = self._tasks.spawn(worker.run(), name=f"aiodelayq-worker:{name}", quiet=True)
                    task.add_done_callback(_report)
                    self._workers.append((worker, task))
        except BaseException:
            await asyncio.shield(self._close())
            raise
        finally:
            self._opened.set()
        self.state = "open"
        log.info("queues opened: %s (%d worker(s))", ", ".join(self._queues), len(self._workers))
        return self

    async def __aenter__(self) -> Queues:
        """Open (see :meth:`open`)."""
        return await self.open()

    async def aclose(self) -> None:
        """Drain the workers, close the queues, then the client if made here; bounded by
        ``close_timeout_s``, idempotent; a cancelled caller stops waiting, the close completes."""
        if self.state == "opening":
            await self._opened.wait()  # closing halfway through an open would race it
        if self.state == "new" and self._closing is None:
            return
        if self._closing is None:
            self._closing = asyncio.get_running_loop().create_task(self._close(), name="aiodelayq-queues-close")
        closing = self._closing
        await asyncio.shield(closing)

    def _make_client(self) -> AnyClient:
        if isinstance(self._redis, str):
            return Redis.from_url(self._redis, **self._redis_options)
        if isinstance(self._redis, (Redis, RedisCluster)):
            return self._redis
        return self._redis()

    async def _close(self) -> None:
        self.state = "closing"
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.close_timeout_s
        try:
            for worker, _ in self._workers:
                worker.stop()
            tasks = {task for _, task in self._workers}
            if tasks:
                await asyncio.wait(tasks, timeout=max(0.0, deadline - loop.time() - _CUT_OFF_S))
            await self._tasks.aclose(loop.time() + _CUT_OFF_S)
            await asyncio.gather(*(q.aclose() for q in self._queues.values()), return_exceptions=True)
            client = self._client
            if client is not None and client is not self._redis:
                with contextlib.suppress(asyncio.TimeoutError):
                    async with timeout(max(0.5, deadline - loop.time())):
                        await client.aclose()
        finally:
            self._workers, self._queues, self._client = [], {}, None
            self.state, self._closing = "new", None
            log.info("queues closed")


def _report(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("worker %s stopped with an error", task.get_name(), exc_info=task.exception())
