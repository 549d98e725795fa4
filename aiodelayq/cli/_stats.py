"""``stats``, ``watch`` and ``ls``: the counts of queues, once, refreshed live, or of the queues
``SCAN`` finds."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Annotated

import typer

from ._arguments import AsJson, Connection, QueueNames, connection_options, seconds
from ._running import run

if TYPE_CHECKING:
    from rich.console import RenderableType

    from .._admin.connect import Target
    from .._admin.reads import QueueRow
    from .._redis.connections import AnyRedis

__all__ = ["list_queues", "stats", "watch"]


@connection_options
def stats(names: QueueNames, *, connection: Connection, as_json: AsJson = False) -> None:
    """Pending, ready, in-flight and dead-letter counts and the next due time of each queue."""
    run(_stats(connection.target(), names, as_json))


async def _stats(target: Target, names: Sequence[str], as_json: bool) -> None:
    from .._admin.connect import connect
    from ._render import counts_json, counts_table, make_console, print_json

    async with connect(target) as client:
        rows, now_ms = await _snapshot(client, names)
    if as_json:
        print_json({"server_time_ms": now_ms, "queues": [counts_json(row, now_ms) for row in rows]})
    else:
        make_console().print(counts_table(rows, now_ms))


async def _snapshot(client: AnyRedis, names: Sequence[str],
                    shards: Mapping[str, int] | None = None) -> tuple[list[QueueRow], int]:
    """Each queue's counts and the server time they are shown against (``shards``: as
    :func:`~aiodelayq._admin.reads.queue_counts` takes them)."""
    from .._admin.reads import queue_counts, server_now_ms

    rows = await queue_counts(client, names, shards)
    return rows, await server_now_ms(client)


@connection_options
def watch(names: QueueNames, *, connection: Connection,
          interval: Annotated[float, typer.Option("--interval", parser=seconds(0.1), metavar="SECONDS",
                                                  help="Seconds between refreshes (at least 0.1).")] = 2.0,
          count: Annotated[int | None, typer.Option("--count", min=1, metavar="N",
                                                    help="Stop after N refreshes.")] = None) -> None:
    """The stats table, refreshed live until Ctrl-C or SIGTERM (or --count refreshes)."""
    try:
        run(_watch(connection.target(), names, interval, count), sigterm_interrupts=True)
    except KeyboardInterrupt:  # Ctrl-C (or SIGTERM) is how a watch ends: exit 0, no "Aborted!" from click
        raise typer.Exit(0) from None


async def _watch(target: Target, names: Sequence[str], interval: float, count: int | None) -> None:
    import asyncio

    from rich.live import Live

    from .._admin.connect import connect
    from ._render import make_console

    async with connect(target) as client:
        typer.echo(f"aiodelayq: watching {len(names)} queue(s) on {target} every {interval:g} s; Ctrl-C stops",
                   err=True)
        console = make_console()
        try:
            # Ended by Ctrl-C or SIGTERM too: Live prints its last frame on the way out.
            with Live(console=console, auto_refresh=False) as live:
                refreshes = 0
                while count is None or refreshes < count:
                    if refreshes:
                        await asyncio.sleep(interval)
                    live.update(await _watch_frame(client, names, interval), refresh=True)
                    refreshes += 1
        finally:
            if not console.is_terminal:
                console.line()  # rich ends the last frame with a newline only on a terminal


async def _watch_frame(client: AnyRedis, names: Sequence[str], interval: float) -> RenderableType:
    """The table now, or the error of this refresh: a blip must not end a watch."""
    from redis.exceptions import RedisError
    from rich.text import Text

    from ..exceptions import BackendError
    from ._render import counts_table, iso_utc

    try:
        rows, now_ms = await _snapshot(client, names)
    except (BackendError, RedisError) as exc:
        return Text(f"aiodelayq: {exc} (trying again every {interval:g} s)")
    return counts_table(rows, now_ms, title=f"server time {iso_utc(now_ms)}, every {interval:g} s (Ctrl-C stops)")


@connection_options
def list_queues(match: Annotated[str, typer.Option("--match", metavar="GLOB",
                                                   help="Shell-style glob on the queue name.")] = "*",
                limit: Annotated[int, typer.Option("--limit", min=1, metavar="N",
                                                   help="Stop after N queues.")] = 1000,
                max_scan_calls: Annotated[int, typer.Option("--max-scan-calls", min=1, metavar="N",
                                                            help="Most SCAN calls (COUNT 1000) per key prefix "
                                                            "and server.")] = 1000,
                *, connection: Connection, as_json: AsJson = False) -> None:
    """Queues found by SCAN (pending, dead-letter and in-flight keys; every primary of a Cluster), with
    their counts."""
    run(_ls(connection.target(), match, limit, max_scan_calls, as_json))


async def _ls(target: Target, match: str, limit: int, max_scan_calls: int, as_json: bool) -> None:
    from .._admin.connect import connect
    from .._admin.scan import scan_queues
    from ._render import counts_json, counts_table, make_console, print_json

    async with connect(target) as client:
        found = await scan_queues(client, match, limit, max_scan_calls)
        rows, now_ms = await _snapshot(client, found.names, found.shards)
    if as_json:
        print_json({"server_time_ms": now_ms, "match": match, "complete": found.complete, "note": found.note,
                    "queues": [counts_json(row, now_ms) for row in rows]})
        return
    summary = f"{len(rows)} queue(s)" + ("" if found.complete else f"; STOPPED EARLY: {found.note}")
    make_console().print(counts_table(rows, now_ms, title=f"queues matching {match!r}", caption=summary))
