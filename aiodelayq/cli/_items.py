"""``peek``, ``offer`` and ``cancel``: a queue's pending items, read, added or cancelled by key."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from ._arguments import AsJson, CodecName, CodecOpt, Connection, QueueName, connection_options, seconds
from ._running import on_queue, read_queue, run

if TYPE_CHECKING:
    from .._admin.connect import Target

__all__ = ["cancel", "offer", "peek"]


@connection_options
def peek(name: QueueName,
         number: Annotated[int, typer.Option("-n", "--number", min=1, max=1000, metavar="N",
                                             help="How many items (1 to 1000).")] = 20,
         *, connection: Connection, codec: CodecOpt = CodecName.JSON, as_json: AsJson = False) -> None:
    """The soonest-due pending items: due time, key, value (raw bytes when undecodable or malformed)."""
    run(_peek(connection.target(), name, number, codec.value, as_json))


async def _peek(target: Target, name: str, number: int, codec: str, as_json: bool) -> None:
    from ._render import iso_utc, make_console, pending_json, pending_table, print_json

    items, now_ms = await read_queue(target, name, codec, lambda queue: queue.peek(number),
                                     shows_nothing=lambda items: not items)
    if as_json:
        print_json({"queue": name, "server_time_ms": now_ms, "items": [pending_json(i, now_ms) for i in items]})
    else:
        table = pending_table(items, now_ms, title=f"{name}: {len(items)} soonest due",
                              caption=f"server time {iso_utc(now_ms)}")
        make_console().print(table)


@connection_options
def offer(name: QueueName,
          value: Annotated[str, typer.Argument(metavar="VALUE", help="The item: JSON text for the json and msgpack "
                                               "codecs, text for str, the argument's bytes for bytes.")],
          delay: Annotated[float, typer.Option("--delay", parser=seconds(0.0), metavar="SECONDS",
                                               help="Seconds until it is due.")] = 0.0,
          key: Annotated[str | None, typer.Option("--key", metavar="KEY",
                                                  help="Its key (unique among pending items).")] = None,
          replace: Annotated[bool, typer.Option("--replace", help="Replace the pending item of --key.")] = False,
          *, connection: Connection, codec: CodecOpt = CodecName.JSON) -> None:
    """Add an item, due after --delay seconds; prints its due time (and with --key what happened)."""
    run(_offer(connection.target(), name, value, delay, key, replace, codec.value))


async def _offer(target: Target, name: str, text: str, delay: float, key: str | None, replace: bool,
                 codec: str) -> None:
    from .._admin.connect import BadInput, connect
    from .._admin.reads import server_now_ms, with_queue
    from .._producing.keyed import Offered
    from ._input import parse_value
    from ._render import iso_utc, relative

    if replace and key is None:
        raise BadInput("--replace needs --key")
    item = parse_value(text, codec)  # before connecting: a bad VALUE is a usage error
    async with connect(target) as client, with_queue(client, name, codec) as queue:
        due = await (queue.offer(item, delay) if key is None else queue.offer(item, delay, key=key, replace=replace))
        now_ms = await server_now_ms(client)
    when = f"due {relative(int(due), now_ms)}, {iso_utc(int(due))} ({int(due)})"
    if not isinstance(due, Offered):
        typer.echo(f"offered to {name}: {when}")
    elif not due.added:
        typer.echo(f"key {key!r} of {name} was already pending, nothing changed: {when}; --replace replaces it")
    else:
        typer.echo(f"key {key!r} of {name} {'replaced' if due.replaced else 'added'}: {when}")


@connection_options
def cancel(name: QueueName, key: Annotated[str, typer.Argument(metavar="KEY", help="The key of the pending item.")],
           *, connection: Connection) -> None:
    """Cancel the pending item of KEY. Exit 0 if it was pending (and is now gone), 1 if it was not."""
    if not run(on_queue(connection.target(), name, lambda queue: queue.cancel(key))):
        typer.echo(f"key {key!r} of {name} was not pending: nothing cancelled")
        raise typer.Exit(1)
    typer.echo(f"cancelled key {key!r} of {name} (it was pending)")
