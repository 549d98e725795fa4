"""Background tasks: one owner for each set of them, stopped within one deadline, and the
caller's cancellation never swallowed.

Everything here is asyncio's own: tasks, and deadlines with :func:`timeout` (``asyncio.timeout``, or
the ``async-timeout`` package it came from on Pythons before 3.11.3, as redis-py does). A queue
object's background tasks (its take pump, hand-off finishes, settles, undone receives) belong to
one :class:`TaskOwner`; what a client's open queues share (the subscriber, the safety poll, the
transfer tasks) to another. Each owner is closed by one ``aclose(deadline)``.

Three helpers do what asyncio does not do by itself: leave a redis-py call behind instead of
waiting for it (:func:`detached`), re-deliver a cancellation that redis-py swallowed (every stop
here), and keep bounded cleanup going when ``asyncio.run`` cancels every task at shutdown
(:func:`wait_through_cancellation`, :func:`run_through_cancellation`).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import signal
import sys
import threading
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from typing import Any, TypeVar, cast

from ..exceptions import BackendError

if sys.version_info >= (3, 11, 3):
    from asyncio import timeout as _timeout  # type: ignore[attr-defined,unused-ignore]
else:  # asyncio.timeout's own origin; redis-py depends on it on these Pythons too
    from async_timeout import timeout as _timeout

__all__ = ["Supervised", "TaskOwner", "cancel_on_signal", "detached", "gather_all", "keep", "run_interruptible",
           "run_through_cancellation", "stop_task", "timeout", "wait_event", "wait_through_cancellation"]

log = logging.getLogger("aiodelayq")


T = TypeVar("T")


def timeout(timeout_s: float | None) -> Any:
    """``async with timeout(s):`` cancels its block after ``timeout_s`` seconds (``None`` or
    ``math.inf``: never) and raises ``asyncio.TimeoutError`` from it; a cancellation from outside
    propagates as itself."""
    return _timeout(None if timeout_s is None or math.isinf(timeout_s) else max(0.0, timeout_s))


async def gather_all(calls: Iterable[Awaitable[T]]) -> list[T]:
    """Await ``calls`` concurrently, each to its end (none is left running unowned); their results in
    order, or the first failure in that order raised (the other calls may have been applied)."""
    results = await asyncio.gather(*calls, return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return cast("list[T]", results)


async def wait_event(event: asyncio.Event, timeout_s: float | None) -> bool:
    """Wait up to ``timeout_s`` seconds (``None``: forever) for ``event``; return whether it is set."""
    if not event.is_set():
        try:
            async with timeout(timeout_s):
                await event.wait()
        except asyncio.TimeoutError:
            pass
    return event.is_set()


async def _stop_all(tasks: Callable[[], set[asyncio.Task[Any]]], deadline: float) -> tuple[bool, bool]:
    """Cancel the tasks ``tasks()`` names until none is left or ``deadline`` (loop time) has passed,
    with at least one loop turn; returns (all ended, this task was cancelled meanwhile).

    redis-py can swallow a cancellation that lands inside a command (redis/redis-py#2028, #2551):
    the cancellation is delivered again every few ms until the task really ends. ``asyncio.wait``
    does not raise the children's ``CancelledError``, so one caught here is the caller's own: it is
    noted and the wait goes on (bounded), so a forced shutdown does not cut the stop short.
    """
    loop = asyncio.get_running_loop()
    cancelled, turns = False, 0
    while True:
        left = {task for task in tasks() if not task.done()}
        if not left or (turns and loop.time() >= deadline):
            return not left, cancelled
        for task in left:
            task.cancel()
        try:
            await asyncio.wait(left, timeout=min(0.02, max(0.0, deadline - loop.time())))
        except asyncio.CancelledError:
            cancelled = True
        turns += 1


async def stop_task(task: asyncio.Task[Any] | None, timeout_s: float, *, report: bool = True) -> bool:
    """Cancel ``task`` and wait up to ``timeout_s`` for it to finish; return whether it finished.
    A failure of the task is logged; so is overrunning the bound, if ``report``. A cancellation of
    the caller meanwhile is raised once the bounded stop is over."""
    if task is None:
        return True
    deadline = asyncio.get_running_loop().time() + timeout_s
    ended, cancelled = await _stop_all(lambda: {task}, deadline)
    if not ended:
        if report:
            log.error("background task %s did not stop within %.1f s", task.get_name(), timeout_s)
    elif not task.cancelled() and task.exception() is not None:
        log.error("background task %s failed", task.get_name(), exc_info=task.exception())
    if cancelled:
        raise asyncio.CancelledError
    return ended


class TaskOwner:
    """The one owner of a set of background tasks (a queue object's, or what a client's open queues
    share): every task is started by :meth:`spawn` (or by a :class:`Supervised` of :meth:`supervise`),
    held until it ends (asyncio itself keeps only weak references), its failure logged unless it is
    a :class:`BackendError` its own code reports, and stopped by :meth:`aclose` within one deadline.

    A task spawned after :meth:`aclose` still runs, held, to its own end: only work that a caller
    awaits starts then (a settle of a message acked after its queue closed).
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self.closed = False
        self._tasks: set[asyncio.Task[Any]] = set()

    def __repr__(self) -> str:
        return f"<TaskOwner {self.name!r} tasks={len(self._tasks)} {'closed' if self.closed else 'open'}>"

    def __len__(self) -> int:
        return len(self._tasks)

    def spawn(self, work: Coroutine[Any, Any, T], *, name: str | None = None, quiet: bool = False) -> asyncio.Task[T]:
        """Start ``work`` as a task of this owner; ``quiet``: its failure is its starter's to report."""
        task = asyncio.get_running_loop().create_task(work, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._quiet_end if quiet else self._end)
        return task

    def supervise(self, name: str, body: Callable[[], Coroutine[Any, Any, None]], *, restart_after_s: float,
                  wanted: Callable[[], bool] = lambda: True,
                  on_crash: Callable[[BaseException], None] | None = None) -> Supervised:
        """A :class:`Supervised` task of this owner (not started yet)."""
        return Supervised(self, name, body, restart_after_s=restart_after_s, wanted=wanted, on_crash=on_crash)

    def _quiet_end(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)

    def _end(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None and not isinstance(exc, BackendError):
            log.error("background task %s of %s failed", task.get_name(), self.name, exc_info=exc)

    async def aclose(self, deadline: float) -> bool:
        """Stop every task still running by ``deadline`` (loop time; at least one loop turn) and
        return whether all ended; those that did not are logged. Idempotent. A cancellation of the
        caller meanwhile (a forced shutdown) does not cut the stop short: it is raised after it."""
        self.closed = True
        ended, cancelled = await _stop_all(lambda: self._tasks, deadline)
        if not ended:
            log.error("%d background task(s) of %s did not stop by the close deadline: %s",
                      len(self._tasks), self.name, ", ".join(sorted(t.get_name() for t in self._tasks)))
        if cancelled:
            raise asyncio.CancelledError
        return ended


# Calls nobody awaits to the end (exchanges whose caller left, detached redis-py calls, one-time
# checks): asyncio keeps only weak references to tasks, so they are held here until they end. Each
# is one call, bounded by its connection's timeouts; background work has a TaskOwner instead.
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
        log.error("background task failed", exc_info=exc)


def keep(task: asyncio.Future[T], *, quiet: bool = False) -> asyncio.Future[T]:
    """Hold a strong reference to the one-call ``task`` until it ends; returns it. Its failures
    other than :class:`BackendError` are logged as bugs unless ``quiet`` (raw redis-py calls, whose
    errors their caller classifies, or which nobody waits for any more)."""
    _detached.add(task)
    task.add_done_callback(functools.partial(_forget, quiet=quiet))
    return task


async def detached(work: Awaitable[T]) -> T:
    """Await ``work`` in a task of its own, so the caller's cancellation always propagates.

    redis-py can swallow a ``CancelledError`` that lands inside a command (redis/redis-py#2028,
    #2551); here the caller stops waiting at once and the command completes in the background
    (bounded by the connection's own timeouts), leaving its connection in a clean state.
    """
    return await asyncio.shield(keep(asyncio.ensure_future(work), quiet=True))


class Supervised:
    """One background task of a :class:`TaskOwner` whose body only ends by cancellation: if it dies
    of anything else (a bug), the error is logged and the body started again after
    ``restart_after_s``, while ``wanted()`` says it is still needed and the owner is not closed.
    :meth:`stop` ends it for good.

    Attributes:
        crashes: how many times the body died of an error and was restarted (shown in ``repr``).
    """

    def __init__(self, owner: TaskOwner, name: str, body: Callable[[], Coroutine[Any, Any, None]], *,
                 restart_after_s: float, wanted: Callable[[], bool] = lambda: True,
                 on_crash: Callable[[BaseException], None] | None = None) -> None:
        self.name = name
        self._owner = owner
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
        """Start the body unless it runs, or the task or its owner was stopped."""
        if not self._stopped and not self._owner.closed and not self.running:
            self._task = self._owner.spawn(self._body(), name=self.name, quiet=True)
            self._task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        if task.cancelled() or self._stopped:  # stopped: stop_task reports a failure
            return
        exc = task.exception()
        if exc is None:
            return
        self.crashes += 1
        log.error("background task %s died; restarting in %.1f s", self.name,
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
    interrupted: list[bool] = []
    try:
        return asyncio.run(cancel_on_signal(work, signal.SIGINT, lambda: interrupted.append(True)))
    except asyncio.CancelledError:
        if interrupted:
            raise KeyboardInterrupt from None
        raise


async def cancel_on_signal(work: Coroutine[Any, Any, T], signum: int, noted: Callable[[], None]) -> T:
    """``await work`` in the current task; the signal ``signum`` calls ``noted()`` and cancels it, so it
    unwinds as on any cancellation. The handler is removed then: a second signal has its default
    effect (Ctrl-C twice forces)."""
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None

    def on_signal() -> None:
        noted()
        loop.remove_signal_handler(signum)
        task.cancel()

    loop.add_signal_handler(signum, on_signal)
    try:
        return await work
    finally:
        loop.remove_signal_handler(signum)
