"""How a command runs: one coroutine on a new event loop, with a fresh client
(:func:`aiodelayq._admin.connect.connect`); failures the operator can act on become one line on stderr:
exit 1 for the server or the queue, exit 2 for a bad argument. Redis-py and the queue code are imported
only when a function runs, so ``aiodelayq --help`` starts fast."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import typer

if TYPE_CHECKING:
    from .._admin.connect import Target
    from .._queue import DelayedQueue
    from .._redis.connections import AnyRedis

__all__ = ["fail", "note_if_unknown", "on_queue", "read_queue", "run"]

T = TypeVar("T")


def fail(message: str, code: int) -> NoReturn:
    """One line on stderr, then exit ``code``: on call, a traceback is noise."""
    typer.echo("aiodelayq: " + " ".join(message.splitlines()), err=True)
    raise typer.Exit(code)


def run(work: Coroutine[Any, Any, T], *, sigterm_interrupts: bool = False) -> T:
    """Run ``work`` on a new event loop (Ctrl-C cancels it, then raises KeyboardInterrupt, on every
    Python; with ``sigterm_interrupts`` SIGTERM does the same); expected failures become one line and
    an exit code."""
    import asyncio
    import signal

    from redis.exceptions import ConnectionError as RedisConnectionError
    from redis.exceptions import RedisError

    from .._admin.connect import BadInput, CannotConnect
    from .._util.tasks import cancel_on_signal, run_interruptible
    from ..exceptions import BackendError, DelayedQueueError, InvalidNameError, WrongNodeError

    terminated: list[bool] = []
    try:
        # SIGTERM cancels the work as Ctrl-C does, so it unwinds the same way (a second: its default).
        return run_interruptible(cancel_on_signal(work, signal.SIGTERM, lambda: terminated.append(True))
                                 if sigterm_interrupts else work)
    except asyncio.CancelledError:
        if not terminated:
            raise
        raise KeyboardInterrupt from None  # SIGTERM ended it, as Ctrl-C does
    except BadInput as exc:
        fail(str(exc), 2)
    except CannotConnect as exc:
        fail(str(exc), 1)
    except InvalidNameError as exc:
        fail(str(exc), 2)
    except WrongNodeError as exc:  # a Cluster node that refused INFO: not recognised as one
        fail(f"{exc} (here: add --cluster)", 1)
    except DelayedQueueError as exc:
        if isinstance(exc, BackendError) and isinstance(exc.__cause__, RedisConnectionError):
            fail(f"lost the connection to the server: {exc}", 1)
        fail(str(exc), 1)
    except RedisError as exc:  # the CLI's own commands (TIME, SCAN): refused, e.g. by an ACL
        fail(f"redis error: {exc}", 1)


async def note_if_unknown(client: AnyRedis, name: str, target: Target) -> None:
    """A note on stderr when no key of the queue exists: a misspelt name reads the same as an idle,
    empty queue, and pausing a misspelt one pauses nothing. Skipped where ``EXISTS`` is refused."""
    from .._admin.reads import queue_exists
    from ..exceptions import AccessDeniedError

    try:
        exists = await queue_exists(client, name)
    except AccessDeniedError:
        return  # the minimal ACL has no EXISTS: no note, the command goes on
    if not exists:
        typer.echo(f"aiodelayq: note: no key of queue {name!r} exists on {target}: it is empty and idle, or the "
                   "name is misspelt ('aiodelayq ls' lists queues)", err=True)


async def on_queue(target: Target, name: str, call: Callable[[DelayedQueue[Any]], Awaitable[T]], *,
                   note_if_unknown_first: bool = False) -> T:
    """``call(queue)`` on a queue object of ``name`` (never opened) on a client of ``target``; first,
    with ``note_if_unknown_first``, a note when none of the queue's keys exists."""
    from .._admin.connect import connect
    from .._admin.reads import with_queue

    async with connect(target) as client, with_queue(client, name) as queue:
        if note_if_unknown_first:
            await note_if_unknown(client, name, target)
        return await call(queue)


async def read_queue(target: Target, name: str, codec: str, read: Callable[[DelayedQueue[Any]], Awaitable[T]],
                     shows_nothing: Callable[[T], bool]) -> tuple[T, int]:
    """``read(queue)`` on a queue object of ``name`` decoding with ``codec``, and the server time to
    show it against (epoch ms); when ``shows_nothing`` of what it read, a note if none of the queue's
    keys exists."""
    from .._admin.connect import connect
    from .._admin.reads import server_now_ms, with_queue

    async with connect(target) as client, with_queue(client, name, codec) as queue:
        found = await read(queue)
        now_ms = await server_now_ms(client)
        if shows_nothing(found):
            await note_if_unknown(client, name, target)
    return found, now_ms
