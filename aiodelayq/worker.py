"""Run a worker as a process: ``aiodelayq worker pkg.module:handler --queue NAME`` (the CLI extra), or
:func:`run_worker` from your own ``__main__``. The :class:`Worker` itself is ``DelayedQueue.worker``'s.

The process opens one client and the queue, runs the worker until SIGTERM or SIGINT, then drains:
running handlers get ``drain_timeout_s`` seconds, nothing new starts; a second signal cuts them off
at once and hands their messages back. Then the queue closes, then the client (in that order).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import os
import signal
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import AbstractAsyncContextManager
from typing import Any

from redis.asyncio import Redis, RedisCluster
from redis.exceptions import RedisError

from ._consuming.handler import Reject, Retry, check_handler
from ._consuming.worker_outcomes import WorkerStats
from ._consuming.worker_slots import Worker
from ._options import WorkerOptions
from ._queue import DelayedQueue
from ._util.urls import redact
from .exceptions import ConfigurationError, DelayedQueueError

__all__ = ["Reject", "Retry", "Worker", "WorkerStats", "load_handler", "run_worker"]

log = logging.getLogger("aiodelayq")

Handler = Callable[[Any], Awaitable[object]]
Connect = Callable[[], AbstractAsyncContextManager[Redis | RedisCluster]]


def load_handler(spec: str) -> Handler:
    """The async callable named by ``"package.module:function"`` (``function`` may be dotted:
    ``module:Class.method``), imported with the current directory on ``sys.path``, as uvicorn does.

    Raises:
        ConfigurationError: a malformed spec, a module or attribute that cannot be imported, or an
            object that is not an async callable (the rule of every worker: see
            :meth:`~aiodelayq.DelayedQueue.consume`).
    """
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigurationError(f"handler must look like 'package.module:function', not {spec!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigurationError(f"cannot import handler module {module_name!r}: {exc}") from exc
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ConfigurationError(f"module {module_name!r} has no attribute {attr!r}") from None
    return check_handler(obj, f"handler {spec!r}")


def run_worker(handler: str | Handler, *, queue: str, redis_url: str = "redis://localhost:6379/0",
               max_deliveries: int | None = 5, codec: str = "json", concurrency: int = 16,
               visibility_timeout_s: float = 30.0, reliable: bool = True, drain_timeout_s: float = 30.0,
               connect: Connect | None = None) -> int:
    """Blocking: run a worker on ``queue`` until SIGTERM/SIGINT, then drain (see the module docstring).
    ``connect``: an async context manager factory giving the client, for a Cluster or Sentinel; without
    it, ``Redis.from_url(redis_url)``, checked with a ``PING``. Logs lifecycle events at INFO (configures
    logging to stderr if nothing did). The worker's options are :class:`~aiodelayq.WorkerOptions`'s.
    ``max_deliveries``: the queue's limit before a failing item is dead-lettered (0 or ``None``: no limit);
    5 by default because a worker retries failures by itself, so an item that always fails would loop.

    Returns:
        The process exit code: 0 once stopped by a signal or because the queue closed; 1 if the
        worker could not run (Redis unreachable, missing permissions), with one line on stderr; 2
        for a bad handler (one that is not an async callable, as for every worker) or option,
        before connecting.
    """
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        function = load_handler(handler) if isinstance(handler, str) else check_handler(handler)
        options = WorkerOptions.of(locals())
        return asyncio.run(_serve(function, queue=queue, connect=connect or _from_url(redis_url),
                                  max_deliveries=max_deliveries, codec=codec, options=options))
    except (ConfigurationError, ValueError) as exc:  # ValueError: a malformed Redis URL
        print(f"aiodelayq worker: {exc}", file=sys.stderr)
        return 2
    except DelayedQueueError as exc:
        print(f"aiodelayq worker: {exc}", file=sys.stderr)
        return 1


class _Unreachable(Exception):
    """The server did not answer the first ``PING`` (the message is the one line to print)."""


def _from_url(redis_url: str) -> Connect:
    """The default ``connect``: ``Redis.from_url(redis_url)``, checked with one ``PING``."""

    @contextlib.asynccontextmanager
    async def connect() -> AsyncIterator[Redis]:
        client = Redis.from_url(redis_url)
        try:
            try:
                # One line now rather than retry warnings until the queue's open_timeout_s.
                await asyncio.wait_for(client.ping(), 5.0)
            except (RedisError, OSError, asyncio.TimeoutError) as exc:
                raise _Unreachable(f"cannot connect to {redact(redis_url)}: {exc or type(exc).__name__}") from None
            yield client
        finally:
            await client.aclose()

    return connect


async def _serve(handler: Handler, *, queue: str, connect: Connect, max_deliveries: int | None, codec: str,
                 options: WorkerOptions) -> int:
    try:
        async with connect() as client:
            q: DelayedQueue[Any] = DelayedQueue(client, queue, codec=codec, max_deliveries=max_deliveries or None)
            worker = Worker(q, handler, options)
            with _signals(worker) as stopped_early:
                try:
                    async with q:
                        log.info("worker on %r started (concurrency %d, %s, visibility timeout %.1f s, "
                                 "max deliveries %s)", queue, options.concurrency,
                                 "reliable" if options.reliable else "plain", options.visibility_timeout_s,
                                 max_deliveries)
                        await worker.run()
                except asyncio.CancelledError:
                    if not stopped_early:  # not our signal: someone else cancelled this task
                        raise
                    uncancel = getattr(asyncio.current_task(), "uncancel", None)  # Python >= 3.11
                    if uncancel is not None:
                        uncancel()  # our own request, handled: later timeouts in this task work as usual
            log.info("worker on %r stopped: %s", queue, worker.stats)
            return 0
    except _Unreachable as exc:
        print(f"aiodelayq worker: {exc}", file=sys.stderr)
        return 1


@contextlib.contextmanager
def _signals(worker: Worker[Any]) -> Iterator[list[int]]:
    """SIGTERM/SIGINT: the first drains, the second stops at once; restored on exit. Yields a list
    that gets an entry if a signal cancelled the task while the queue was still opening."""
    loop = asyncio.get_running_loop()
    main = asyncio.current_task()
    received = 0
    stopped_early: list[int] = []

    def on_signal(signum: int) -> None:
        nonlocal received
        received += 1
        name = signal.Signals(signum).name
        if worker.state == "new" and main is not None:  # still opening: nothing to drain
            log.info("%s while starting; stopping", name)
            stopped_early.append(signum)
            main.cancel()
        elif received == 1:
            log.info("%s: draining (up to %.1f s; send it again to stop at once)", name,
                     worker.drain_timeout_s)
            worker.stop()
        else:
            log.info("%s again: stopping now, handing running messages back", name)
            worker.abort()

    signums = (signal.SIGTERM, signal.SIGINT)
    for signum in signums:
        loop.add_signal_handler(signum, on_signal, signum)
    try:
        yield stopped_early
    finally:
        for signum in signums:
            loop.remove_signal_handler(signum)
