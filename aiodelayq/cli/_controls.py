"""``pause``, ``resume``, ``rate-limit`` and ``concurrency``: the controls every consumer of a queue
obeys, in every process."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Annotated, Any

import typer

from ._arguments import Connection, QueueName, connection_options
from ._running import fail, on_queue, run

if TYPE_CHECKING:
    from .._queue import DelayedQueue

__all__ = ["concurrency", "pause", "rate_limit", "resume"]


@connection_options
def pause(name: QueueName, *, connection: Connection) -> None:
    """Pause every consumer of the queue, in every process, until `resume` (offers and transfers go on)."""
    _control(connection, name, lambda queue: queue.pause(),
             f"paused {name}: its consumers hand nothing out until 'aiodelayq resume {name}'")


@connection_options
def resume(name: QueueName, *, connection: Connection) -> None:
    """Resume the consumers of a paused queue."""
    _control(connection, name, lambda queue: queue.resume(), f"resumed {name}")


@connection_options
def rate_limit(name: QueueName,
               rate: Annotated[str, typer.Argument(metavar="RATE", help="Items per second for all consumers "
                                                   "together: 100/s, 6000/min, 2.5 (per second), or off.")],
               burst: Annotated[int | None, typer.Option("--burst", min=1, metavar="N", help="Most items let out "
                                                         "at once (default: one second's worth).")] = None,
               *, connection: Connection) -> None:
    """Limit how fast all consumers of the queue together get items (a token bucket on the server clock)."""
    from .._admin.connect import BadInput
    from ._input import parse_rate

    try:
        per_second = parse_rate(rate)  # before connecting: a usage error
    except BadInput as exc:
        fail(str(exc), 2)
    _control(connection, name, lambda queue: queue.set_rate_limit(per_second, burst),
             f"rate limit of {name}: " + ("none" if per_second is None else f"{per_second:g}/s"))


@connection_options
def concurrency(name: QueueName,
                limit: Annotated[str, typer.Argument(metavar="N", help="Most messages all reliable consumers "
                                                     "together hold at once (an int >= 1), or off.")],
                *, connection: Connection) -> None:
    """Limit how many messages the reliable consumers of the queue hold at once, in every process together."""
    if limit.strip().lower() == "off":
        most = None
    elif limit.strip().isdigit() and int(limit) >= 1:
        most = int(limit)
    else:
        fail(f"N must be an int >= 1 or 'off', not {limit!r}", 2)  # before connecting: a usage error
    _control(connection, name, lambda queue: queue.set_concurrency_limit(most),
             f"concurrency limit of {name}: " + ("none" if most is None else str(most)))


def _control(connection: Connection, name: str, call: Callable[[DelayedQueue[Any]], Awaitable[None]],
             done: str) -> None:
    """``call(queue)``, after a note when none of the queue's keys exists (a misspelt name controls
    nothing); then ``done`` on stdout."""
    run(on_queue(connection.target(), name, call, note_if_unknown_first=True))
    typer.echo(done)
