"""``events``: a queue's event stream (``set_events`` turns it on): the last stored events, then with
``--follow`` each new one as it comes, until Ctrl-C or SIGTERM. One line an event; ``--json``: one
JSON object a line (JSON Lines), so a follower's output can be piped as it comes."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from ._arguments import AsJson, Connection, QueueName, connection_options
from ._running import run

if TYPE_CHECKING:
    from .._admin.connect import Target
    from .._contents.event_stream import QueueEvent

__all__ = ["events"]


@connection_options
def events(name: QueueName,
           number: Annotated[int, typer.Option("-n", "--number", min=1, metavar="N",
                                               help="How many stored events first, newest last.")] = 20,
           follow: Annotated[bool, typer.Option("--follow", "-f", help="Then each new event as it comes, "
                                                "until Ctrl-C.")] = False,
           *, connection: Connection, as_json: AsJson = False) -> None:
    """A queue's last events (its stream is on once set_events turned it on), oldest first; with
    --follow, then each new one as it comes. A sharded queue's shards are merged by time."""
    try:
        run(_events(connection.target(), name, number, follow, as_json), sigterm_interrupts=True)
    except KeyboardInterrupt:  # Ctrl-C (or SIGTERM) is how a follow ends: exit 0
        raise typer.Exit(0) from None


async def _events(target: Target, name: str, number: int, follow: bool, as_json: bool) -> None:
    import sys

    from .._admin.connect import connect
    from .._admin.reads import with_queue
    from ._render import event_json, event_line

    def show(event: QueueEvent) -> None:
        import json

        sys.stdout.write((json.dumps(event_json(event), ensure_ascii=False) if as_json else event_line(event)) + "\n")
        sys.stdout.flush()

    async with connect(target) as client, with_queue(client, name) as queue:
        recent = await queue.recent_events(number)
        for event in recent:
            show(event)
        if not recent and not as_json:
            typer.echo(f"{name}: no events stored (the stream is on only once set_events turned it on)", err=True)
        if follow:
            async for event in queue.events(recent[-1].id if recent else "$"):
                show(event)
