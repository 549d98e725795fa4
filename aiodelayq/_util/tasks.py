"""Background tasks: one owner for each set of them, stopped within one deadline, and the
caller's cancellation never swallowed.

A queue object's tasks belong to one :class:`TaskOwner`; what a client's open queues share to another.

redis-py can swallow a cancellation that lands inside a command (redis/redis-py#2028, #2551): every
stop here re-delivers it, and :func:`detached` leaves the call behind instead of waiting for it.
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
from .clock import reached

if sys.version_info >= (3, 11, 3):
    from asyncio import timeout as _timeout  # type: ignore[attr-defined,unused-ignore]
else:  # asyncio.timeout's own origin; redis-py depends on it on these Pythons too
    from async_timeout import timeout as _timeout

__all__ = ["Supervised", "TaskOwner", "cancel_on_signal", "detached", "gather_all", "keep", "run_interruptible",
           "run_through_cancellation", "stop_task", "timeout", "wait_event", "wait_through_cancellation"]

log = logging.getLogger("aiodelayq")


T = TypeVar("T")


def timeout(timeout_s: float | None) -> Any:
    """``async with timeout(s):`` cancels its block after ``timeout_s`` seconds (``None``/``inf``:
    never) and raises ``asyncio.TimeoutError``."""
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
    """Cancel ``tasks()`` every few ms (redis-py may swallow one) until none is left or ``deadline``
    (loop time) passed, at least one loop turn; returns (all ended, this task was cancelled).
    A ``CancelledError`` here is the caller's own (``asyncio.wait`` does not raise the children's):
    noted, and the bounded stop goes on."""
    loop = asyncio.get_running_loop()
    cancelled, turns = False, 0
    while True:
        left = {task for task in tasks() if not task.done()}
        if not left or (turns and reached(loop.time(), deadline)):
            return not left, cancelled
        for task in left:
            task.cancel()
        try:
            await asyncio.wait(left, timeout=min(0.02, max(0.0, deadline - loop.time())))
        except asyncio.CancelledError:
            cancelled = True
        turns += 1


async def stop_task(task: asyncio.Task[Any] | None, timeout_s: float, *, report: bool = True) -> bool:
    """Cancel ``task`` and wait up to ``timeout_s`` for it; return whether it finished. Its failure
    is logged (an overrun too, if ``report``); the caller's cancellation is raised after the stop."""
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
    """The one owner of a set of background tasks: holds each until it ends (asyncio keeps only weak
    references), logs failures other than :class:`BackendError`, stops them in :meth:`aclose`.

    A task spawned after :meth:`aclose` still runs to its end: only awaited work starts then.
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
        """Stop every task by ``deadline`` (loop time) and return whether all ended. Idempotent; the
        caller's cancellation (a forced shutdown) is raised after the stop."""
        self.closed = True
        ended, cancelled = await _stop_all(lambda: self._tasks, deadline)
        if not ended:
            log.error("%d background task(s) of %s did not stop by the close deadline: %s",
                      len(self._tasks), self.name, ", ".join(sorted(t.get_name() for t in self._tasks)))
        if cancelled:
            raise asyncio.CancelledError
        return ended


# One-call tasks nobody awaits to the end, held until they end; each is bounded by its connection's timeouts.
_detached: set[asyncio.Future[Any]] = set()


def _forget(task: asyncio.Future[Any], *, quiet: bool) -> None:
    _detached.discard(task)
    # Retrieved here, so asyncio does not log "exception was never retrieved" for an abandoned task.
    if task.cancelled():
        return
    exc = task.exception()
    if exc is not None and not quiet and not isinstance(exc, BackendError):
        log.error("background task failed", exc_info=exc)


def keep(task: asyncio.Future[T], *, quiet: bool = False) -> asyncio.Future[T]:
    """Hold ``task`` until it ends; returns it. Failures other than :class:`BackendError` are logged
    unless ``quiet`` (raw redis-py calls, whose caller classifies errors)."""
    _detached.add(task)
    task.add_done_callback(functools.partial(_forget, quiet=quiet))
    return task


async def detached(work: Awaitable[T]) -> T:
    """Await ``work`` in a task of its own, so the caller's cancellation always propagates; the
    command completes in the background, leaving its connection clean."""
    return await asyncio.shield(keep(asyncio.ensure_future(work), quiet=True))


class Supervised:
    """A :class:`TaskOwner`'s task whose body only ends by cancellation: if it dies of a bug, it is
    logged and restarted after ``restart_after_s`` while ``wanted()`` and the owner is open.

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
    """Wait up to ``timeout_s`` seconds for ``futures`` even if this task is cancelled meanwhile, so
    a forced shutdown (``asyncio.run`` cancels every task) does not abandon cleanup. Returns whether
    a cancellation arrived: the caller raises it after the wait.
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
    """:func:`wait_through_cancellation` of a ``make()`` task, started again while time remains if a
    forced shutdown cancelled it (even before its first step); cancelled at the bound. Returns whether
    this task was cancelled meanwhile (the caller raises it).
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
        if not task.cancelled() or reached(loop.time(), deadline):
            if not task.cancelled():
                task.exception()  # retrieved: the work logs its own failures
            return cancelled


def run_interruptible(work: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(work)``, where Ctrl-C cancels ``work`` and, once it has unwound, raises
    :class:`KeyboardInterrupt` (a second Ctrl-C interrupts at once), as 3.11's ``asyncio.run`` does;
    3.10's raises it mid-read. Only in the main thread with the default SIGINT handler.
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
    """``await work``; the signal ``signum`` calls ``noted()`` and cancels it, once (a second signal
    has its default effect)."""
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
