"""Small helpers for owned background tasks: stop them within a bound, never swallow the caller's
cancellation."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

__all__ = ["run_through_cancellation", "shielded", "stop_task", "wait_through_cancellation", "within"]

log = logging.getLogger("aiodelayq")


async def stop_task(task: asyncio.Task[object] | None, timeout_s: float) -> bool:
    """Cancel ``task`` and wait up to ``timeout_s`` for it to finish; return whether it finished.

    ``asyncio.wait`` does not raise the child's ``CancelledError``, so a ``CancelledError`` that
    escapes here is always the caller's own cancellation, and it propagates.
    """
    if task is None:
        return True
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    # redis-py can swallow a cancellation that lands inside a command (redis/redis-py#2028,
    # #2551): re-deliver it until the task really stops, as anyio's cancel scopes do.
    task.cancel()
    await asyncio.wait({task}, timeout=0)  # at least one loop turn, whatever the bound
    while not task.done() and loop.time() < deadline:
        task.cancel()
        await asyncio.wait({task}, timeout=min(0.02, max(0.0, deadline - loop.time())))
    if not task.done():
        log.error("aiodelayq: background task %s did not stop within %.1f s", task.get_name(), timeout_s)
        return False
    if not task.cancelled() and task.exception() is not None:
        log.error("aiodelayq: background task %s failed", task.get_name(), exc_info=task.exception())
    return True


T = TypeVar("T")
_in_flight: set[asyncio.Future[Any]] = set()


async def shielded(work: Awaitable[T]) -> T:
    """Await a Redis call in a task of its own, so the caller's cancellation always propagates.

    redis-py can swallow a ``CancelledError`` that lands inside a command (redis/redis-py#2028,
    #2551); here the caller stops waiting at once and the command completes in the background
    (bounded by the connection's own timeouts), leaving its connection in a clean state.
    """
    task = asyncio.ensure_future(work)
    _in_flight.add(task)
    task.add_done_callback(_in_flight.discard)
    return await asyncio.shield(task)


async def within(work: Awaitable[Any], timeout_s: float) -> bool:
    """Await ``work`` for at most ``timeout_s`` seconds; return whether it finished (it is cancelled
    if not). Unlike ``asyncio.wait_for`` before Python 3.12, the caller's own cancellation is never
    swallowed when ``work`` completes in the same instant.
    """
    task = asyncio.ensure_future(work)
    try:
        await asyncio.wait({task}, timeout=timeout_s)
    finally:
        if not task.done():
            task.cancel()
    if task.done() and not task.cancelled():
        task.result()  # re-raise its error, if any
        return True
    return False


async def wait_through_cancellation(futures: set[asyncio.Future[Any]], timeout_s: float) -> bool:
    """Wait up to ``timeout_s`` seconds for ``futures`` even if this task is cancelled meanwhile:
    bounded cleanup that must not be cut short (returning popped items, undoing a receive).

    A forced shutdown cancels a task that is already cancelling (``asyncio.run`` cancels every task,
    after the caller's own cancel): without this, the cleanup it started would be abandoned and
    destroyed with the loop. The cancellation is never swallowed: the return value says whether one
    arrived, and the caller raises it once the bounded wait is over.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    cancelled = False
    while True:
        pending = {f for f in futures if not f.done()}
        remaining = deadline - loop.time()
        if not pending or remaining <= 0:
            return cancelled
        try:
            await asyncio.wait(pending, timeout=remaining)
        except asyncio.CancelledError:
            cancelled = True


async def run_through_cancellation(make: Callable[[], Awaitable[Any]], timeout_s: float) -> bool:
    """Run ``make()`` as a task and wait for it through cancellations, for at most ``timeout_s``;
    if a forced shutdown cancelled that task (even before its first step, when its own handlers
    cannot run), start it again while time remains. Returns whether this task was cancelled
    meanwhile (the caller raises it); the work is cancelled if it is still running at the bound.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    cancelled = False
    while True:
        task = asyncio.ensure_future(make())
        cancelled = await wait_through_cancellation({task}, deadline - loop.time()) or cancelled
        if not task.done():
            task.cancel()
            return await wait_through_cancellation({task}, 0.1) or cancelled
        if not task.cancelled() or loop.time() >= deadline:
            if not task.cancelled():
                task.exception()  # retrieved: the work logs its own failures
            return cancelled
