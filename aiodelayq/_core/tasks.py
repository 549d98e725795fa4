"""Owned background tasks: supervise them, stop them within a bound, wait through a forced shutdown,
and never swallow the caller's cancellation.

Deadlines and waits that anyio expresses well use anyio (``move_on_after`` in the scheduler and the
subscriber). What stays here is what anyio's cancel scopes cannot do on asyncio: leave a redis-py
call behind instead of waiting for it (:func:`detached`), re-deliver a cancellation that redis-py
swallowed (:func:`stop_task`), and keep bounded cleanup going when ``asyncio.run`` cancels every
task at shutdown, which is a native cancellation no shielded scope holds off
(:func:`wait_through_cancellation`, :func:`run_through_cancellation`).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import signal
import sys
import threading
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

from ..exceptions import BackendError

__all__ = ["Supervised", "detached", "keep", "run_interruptible", "run_through_cancellation", "stop_task",
           "wait_through_cancellation"]

log = logging.getLogger("aiodelayq")


async def stop_task(task: asyncio.Task[Any] | None, timeout_s: float, *, report: bool = True) -> bool:
    """Cancel ``task`` and wait up to ``timeout_s`` for it to finish; return whether it finished.
    A failure of the task is logged; so is overrunning the bound, if ``report``.

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
        if report:
            log.error("aiodelayq: background task %s did not stop within %.1f s", task.get_name(), timeout_s)
        return False
    if not task.cancelled() and task.exception() is not None:
        log.error("aiodelayq: background task %s failed", task.get_name(), exc_info=task.exception())
    return True


T = TypeVar("T")

# Tasks nobody awaits to the end (exchanges whose caller left, detached redis-py calls, one-time
# checks): asyncio keeps only weak references to tasks, so they are held here until they end.
_detached: set[asyncio.Future[Any]] = set()


def _forget(task: asyncio.Future[Any], *, quiet: bool) -> None:
    _detached.discard(task)
    # Whoever still waits gets the outcome; for an abandoned task it is retrieved here, so asyncio
    # does not log "exception was never retrieved" for an answer nobody wanted any more. A failure
    # that is not a Redis failure the library reports (BackendError) is a bug: logged.
    if task.cancelled():
        return
    exc = task.exception()
    if exc is not None and not quiet and not isinstance(exc, BackendError):
        log.error("aiodelayq: background task failed", exc_info=exc)


def keep(task: asyncio.Future[T], *, quiet: bool = False) -> asyncio.Future[T]:
    """Hold a strong reference to ``task`` until it ends; returns it. Its failures other than
    :class:`BackendError` are logged as bugs unless ``quiet`` (raw redis-py calls, whose errors
    their caller classifies, or which nobody waits for any more)."""
    _detached.add(task)
    task.add_done_callback(functools.partial(_forget, quiet=quiet))
    return task


async def detached(work: Awaitable[T]) -> T:
    """Await ``work`` in a task of its own, so the caller's cancellation always propagates.

    redis-py can swallow a ``CancelledError`` that lands inside a command (redis/redis-py#2028,
    #2551); here the caller stops waiting at once and the command completes in the background
    (bounded by the connection's own timeouts), leaving its connection in a clean state. anyio's
    shielding cannot do this: it would wait for the command instead of leaving it.
    """
    return await asyncio.shield(keep(asyncio.ensure_future(work), quiet=True))


class Supervised:
    """One owned background task whose body only ends by cancellation: if it dies of anything else
    (a bug), the error is logged and the body started again after ``restart_after_s``, while
    ``wanted()`` says it is still needed. :meth:`stop` ends it for good."""

    def __init__(self, name: str, body: Callable[[], Coroutine[Any, Any, None]], *, restart_after_s: float,
                 wanted: Callable[[], bool] = lambda: True,
                 on_crash: Callable[[BaseException], None] | None = None) -> None:
        self.name = name
        self._body = body
        self._restart_after_s = restart_after_s
        self._wanted = wanted
        self._on_crash = on_crash
        self._task: asyncio.Task[None] | None = None
        self._stopped = False
        self.crashes = 0

    def __repr__(self) -> str:
        state = "stopped" if self._stopped else ("running" if self.running else "idle")
        return f"<Supervised {self.name} {state} crashes={self.crashes}>"

    @property
    def running(self) -> bool:
        """Whether the body runs now."""
        return self._task is not None and not self._task.done()

    def start(self) -> None:
        """Start the body unless it runs or the task was stopped."""
        if not self._stopped and not self.running:
            self._task = asyncio.get_running_loop().create_task(self._body(), name=self.name)
            self._task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        if task.cancelled() or self._stopped:  # stopped: stop_task reports a failure
            return
        exc = task.exception()
        if exc is None:
            return
        self.crashes += 1
        log.error("aiodelayq: background task %s died; restarting in %.1f s", self.name,
                  self._restart_after_s, exc_info=exc)
        if self._on_crash is not None:
            self._on_crash(exc)
        if task is self._task:  # else a caller already started the body again in the same turn
            self._task = None
            asyncio.get_running_loop().call_later(self._restart_after_s, self._restart)

    def _restart(self) -> None:
        if self._wanted():
            self.start()

    async def stop(self, timeout_s: float, *, report: bool = True) -> bool:
        """Stop the body for good (see :func:`stop_task`); idempotent."""
        self._stopped = True
        task, self._task = self._task, None
        return await stop_task(task, timeout_s, report=report)


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


def run_interruptible(work: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(work)``, where Ctrl-C cancels ``work`` and, once it has unwound (its clients
    closed), raises :class:`KeyboardInterrupt`; a second Ctrl-C interrupts at once. That is what
    ``asyncio.run`` does from Python 3.11 on. On 3.10 it leaves SIGINT to Python's default handler,
    which raises ``KeyboardInterrupt`` in whatever code runs at that instant: in the middle of a
    redis-py read, or between making a coroutine and awaiting it (a lock's), and the shutdown then
    prints those half-done tasks' errors. Only in the main thread with the default handler in place
    (an ignored or replaced SIGINT stays as it is).
    """
    if (sys.version_info >= (3, 11) or threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGINT) is not signal.default_int_handler):
        return asyncio.run(work)
    interrupted = False

    async def main() -> T:
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None

        def on_sigint() -> None:
            nonlocal interrupted
            interrupted = True
            loop.remove_signal_handler(signal.SIGINT)  # the default handler again: a second Ctrl-C forces
            task.cancel()

        loop.add_signal_handler(signal.SIGINT, on_sigint)
        try:
            return await work
        finally:
            loop.remove_signal_handler(signal.SIGINT)

    try:
        return asyncio.run(main())
    except asyncio.CancelledError:
        if interrupted:
            raise KeyboardInterrupt from None
        raise
