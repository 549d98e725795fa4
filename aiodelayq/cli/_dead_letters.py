"""``dead-letters list``, ``requeue`` and ``purge``: a queue's dead-letter list, read, put back into
the queue, or deleted."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer

from ._arguments import AsJson, CodecName, CodecOpt, Connection, QueueName, connection_options, seconds
from ._running import on_queue, read_queue, run

if TYPE_CHECKING:
    from .._admin.connect import Target
    from .._contents.dead_letters import DeadLetter
    from .._queue import DelayedQueue

__all__ = ["list_dead_letters", "purge_dead_letters", "requeue_dead_letters"]


@connection_options
def list_dead_letters(name: QueueName,
                      number: Annotated[int, typer.Option("-n", "--number", min=1, metavar="N",
                                                          help="How many, oldest first.")] = 20,
                      *, connection: Connection, codec: CodecOpt = CodecName.JSON, as_json: AsJson = False) -> None:
    """The oldest dead letters: when and why each died, its deliveries, its value."""
    run(_list_dead_letters(connection.target(), name, number, codec.value, as_json))


async def _list_dead_letters(target: Target, name: str, number: int, codec: str, as_json: bool) -> None:
    from ._render import dead_letter_json, dead_letters_table, make_console, print_json

    async def read(queue: DelayedQueue[Any]) -> tuple[list[DeadLetter[Any]], int]:
        return await queue.dead_letters(number), await _dead_letter_count(queue)

    (letters, total), now_ms = await read_queue(target, name, codec, read, shows_nothing=lambda found: not found[1])
    if as_json:
        print_json({"queue": name, "server_time_ms": now_ms, "total": total,
                    "dead_letters": [dead_letter_json(letter) for letter in letters]})
        return
    table = dead_letters_table(letters, now_ms, title=f"{name}: dead letters, oldest first",
                               caption=f"{len(letters)} of {total} shown")
    make_console().print(table)


@connection_options
def requeue_dead_letters(name: QueueName,
                         limit: Annotated[int | None, typer.Option("--limit", min=1, metavar="N",
                                                                   help="How many, oldest first (default: "
                                                                   "all).")] = None,
                         delay: Annotated[float, typer.Option("--delay", parser=seconds(0.0), metavar="SECONDS",
                                                              help="Seconds until they are due.")] = 0.0,
                         *, connection: Connection) -> None:
    """Put the oldest dead letters back into the queue, due after --delay seconds, in order."""
    count = run(on_queue(connection.target(), name, lambda queue: queue.requeue_dead_letters(limit, delay)))
    typer.echo(f"requeued {count} dead letter(s) of {name}, due in {delay:g} s")


@connection_options
def purge_dead_letters(name: QueueName,
                       yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")] = False,
                       *, connection: Connection) -> None:
    """Delete a queue's dead-letter list (asks first, unless --yes)."""
    target = connection.target()
    if not yes:
        total = run(on_queue(target, name, _dead_letter_count))
        if total == 0:
            typer.echo(f"{name} has no dead letters")
            return
        # Asked outside any event loop and connection: a person may take a while to answer.
        typer.confirm(f"Delete the {total} dead letter(s) of {name}?", abort=True, err=True)
    count = run(on_queue(target, name, lambda queue: queue.purge_dead_letters()))
    typer.echo(f"purged {count} dead letter(s) of {name}")


async def _dead_letter_count(queue: DelayedQueue[Any]) -> int:
    return (await queue.counts()).dead_letters
