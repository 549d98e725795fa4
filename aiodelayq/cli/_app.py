"""The ``aiodelayq`` commands (typer). Each command runs one coroutine on a new event loop (Ctrl-C
cancels it, as ``asyncio.run`` does from Python 3.11 on) with a fresh client (:func:`._ops.connect`,
closed at the end); failures the operator can act on become one line on stderr: exit 1 for the server
or the queue (unreachable, refused, a :class:`DelayedQueueError`), exit 2 for a bad argument. Tables
and results go to stdout, prompts and progress to stderr."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from enum import Enum
from typing import Annotated, Any, NoReturn, TypeVar

import typer
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from rich.console import RenderableType
from rich.live import Live
from rich.text import Text

from .. import __version__
from .._core.tasks import run_interruptible
from .._producing.keyed import Offered
from .._queue import DelayedQueue
from ..exceptions import BackendError, DelayedQueueError
from ._ops import (
    BadInput,
    CannotConnect,
    QueueRow,
    connect,
    parse_rate,
    parse_value,
    queue_counts,
    redact,
    scan_queues,
    server_now_ms,
    with_queue,
)
from ._render import (
    counts_json,
    counts_table,
    dead_letter_json,
    dead_letters_table,
    iso_utc,
    make_console,
    pending_json,
    pending_table,
    print_json,
    relative,
)

__all__ = ["app"]

T = TypeVar("T")

DEFAULT_URL = "redis://localhost:6379/0"


class CodecName(str, Enum):
    """The built-in codecs a command can decode or encode with."""

    JSON = "json"
    STR = "str"
    BYTES = "bytes"
    MSGPACK = "msgpack"


RedisUrl = Annotated[str, typer.Option("--redis-url", envvar="REDIS_URL", help="Redis URL (redis://, rediss://, "
                                       "unix://) of a single server (not a cluster).")]
CodecOpt = Annotated[CodecName, typer.Option("--codec", help="How the queue's payloads are encoded.")]
AsJson = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON instead of a table.")]
QueueName = Annotated[str, typer.Argument(help="Queue name (the destination list, Redisson's queue name).")]
QueueNames = Annotated[list[str], typer.Argument(help="Queue names.")]

# The app's help is _root's docstring. Unexpected exceptions (bugs) keep Python's plain traceback.
app = typer.Typer(name="aiodelayq", no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)
dead_letters_app = typer.Typer(no_args_is_help=True, help="Read, requeue or purge a queue's dead-letter list.")
app.add_typer(dead_letters_app, name="dead-letters")


# -- running a command ---------------------------------------------------------------------------


def _fail(message: str, code: int) -> NoReturn:
    """One line on stderr, then exit ``code``: on call, a traceback is noise."""
    typer.echo("aiodelayq: " + " ".join(message.splitlines()), err=True)
    raise typer.Exit(code)


def _run(work: Coroutine[Any, Any, T]) -> T:
    """Run ``work`` on a new event loop (Ctrl-C cancels it, then raises KeyboardInterrupt, on every
    Python); expected failures become one line and an exit code."""
    try:
        return run_interruptible(work)
    except BadInput as exc:
        _fail(str(exc), 2)
    except CannotConnect as exc:
        _fail(str(exc), 1)
    except DelayedQueueError as exc:
        if isinstance(exc, BackendError) and isinstance(exc.__cause__, RedisConnectionError):
            _fail(f"lost the connection to the server: {exc}", 1)
        _fail(str(exc), 1)
    except RedisError as exc:  # the CLI's own commands (TIME, SCAN): refused, e.g. by an ACL
        _fail(f"redis error: {exc}", 1)


async def _snapshot(client: Redis, names: Sequence[str]) -> tuple[list[QueueRow], int]:
    """Each queue's counts and the server time they are shown against."""
    rows = await queue_counts(client, names)
    return rows, await server_now_ms(client)


def _print_version(value: bool) -> None:
    """``--version``: eager, so it works without a command."""
    if value:
        typer.echo(f"aiodelayq {__version__}")
        raise typer.Exit()


@app.callback()
def _root(version: Annotated[bool, typer.Option("--version", is_eager=True, callback=_print_version,
                                                help="Print the version and exit.")] = False) -> None:
    """Look at and operate aiodelayq / Redisson RDelayedQueue queues on Redis."""


# -- stats, watch ----------------------------------------------------------------------------------


@app.command()
def stats(names: QueueNames, redis_url: RedisUrl = DEFAULT_URL, as_json: AsJson = False) -> None:
    """Pending, ready, in-flight and dead-letter counts and the next due time of each queue."""
    _run(_stats(redis_url, names, as_json))


async def _stats(url: str, names: Sequence[str], as_json: bool) -> None:
    async with connect(url) as client:
        rows, now_ms = await _snapshot(client, names)
    if as_json:
        print_json({"server_time_ms": now_ms, "queues": [counts_json(row, now_ms) for row in rows]})
    else:
        make_console().print(counts_table(rows, now_ms))


@app.command()
def watch(names: QueueNames, redis_url: RedisUrl = DEFAULT_URL,
          interval: Annotated[float, typer.Option("--interval", min=0.1, help="Seconds between refreshes.")] = 2.0,
          count: Annotated[int | None, typer.Option("--count", min=1, help="Stop after this many refreshes.")]
          = None) -> None:
    """The stats table, refreshed live until Ctrl-C (or --count refreshes)."""
    try:
        _run(_watch(redis_url, names, interval, count))
    except KeyboardInterrupt:  # Ctrl-C is how a watch ends: exit 0, no "Aborted!" from click
        raise typer.Exit(0) from None


async def _watch(url: str, names: Sequence[str], interval: float, count: int | None) -> None:
    async with connect(url) as client:
        typer.echo(f"aiodelayq: watching {len(names)} queue(s) on {redact(url)} every {interval:g} s; Ctrl-C stops",
                   err=True)
        console = make_console()
        with Live(console=console, auto_refresh=False) as live:
            refreshes = 0
            while count is None or refreshes < count:
                if refreshes:
                    await asyncio.sleep(interval)
                live.update(await _watch_frame(client, names, interval), refresh=True)
                refreshes += 1
        if not console.is_terminal:
            console.line()  # rich ends the last frame with a newline only on a terminal


async def _watch_frame(client: Redis, names: Sequence[str], interval: float) -> RenderableType:
    """The table now, or the error of this refresh: a blip must not end a watch."""
    try:
        rows, now_ms = await _snapshot(client, names)
    except (BackendError, RedisError) as exc:
        return Text(f"aiodelayq: {exc} (trying again every {interval:g} s)")
    return counts_table(rows, now_ms, title=f"server time {iso_utc(now_ms)}, every {interval:g} s (Ctrl-C stops)")


# -- peek, offer, cancel ---------------------------------------------------------------------------


@app.command()
def peek(name: QueueName,
         number: Annotated[int, typer.Option("-n", "--number", min=1, max=1000, help="How many items.")] = 20,
         redis_url: RedisUrl = DEFAULT_URL, codec: CodecOpt = CodecName.JSON, as_json: AsJson = False) -> None:
    """The soonest-due pending items: due time, key, value (raw bytes when undecodable or malformed)."""
    _run(_peek(redis_url, name, number, codec.value, as_json))


async def _peek(url: str, name: str, number: int, codec: str, as_json: bool) -> None:
    async with connect(url) as client, with_queue(client, name, codec) as queue:
        items = await queue.peek(number)
        now_ms = await server_now_ms(client)
    if as_json:
        print_json({"queue": name, "server_time_ms": now_ms, "items": [pending_json(i, now_ms) for i in items]})
    else:
        table = pending_table(items, now_ms, title=f"{name}: {len(items)} soonest due",
                              caption=f"server time {iso_utc(now_ms)}")
        make_console().print(table)


@app.command()
def offer(name: QueueName,
          value: Annotated[str, typer.Argument(help="The item: JSON text for the json and msgpack codecs, text for "
                                               "str, the argument's bytes for bytes.")],
          delay: Annotated[float, typer.Option("--delay", min=0.0, help="Seconds until it is due.")] = 0.0,
          key: Annotated[str | None, typer.Option("--key", help="Its key (unique among pending items).")] = None,
          replace: Annotated[bool, typer.Option("--replace", help="Replace the pending item of --key.")] = False,
          redis_url: RedisUrl = DEFAULT_URL, codec: CodecOpt = CodecName.JSON) -> None:
    """Add an item, due after --delay seconds; prints its due time (and with --key what happened)."""
    _run(_offer(redis_url, name, value, delay, key, replace, codec.value))


async def _offer(url: str, name: str, text: str, delay: float, key: str | None, replace: bool, codec: str) -> None:
    if replace and key is None:
        raise BadInput("--replace needs --key")
    item = parse_value(text, codec)  # before connecting: a bad VALUE is a usage error
    async with connect(url) as client, with_queue(client, name, codec) as queue:
        due = await (queue.offer(item, delay) if key is None else queue.offer(item, delay, key=key, replace=replace))
        now_ms = await server_now_ms(client)
    when = f"due {relative(int(due), now_ms)}, {iso_utc(int(due))} ({int(due)})"
    if not isinstance(due, Offered):
        typer.echo(f"offered to {name}: {when}")
    elif not due.added:
        typer.echo(f"key {key!r} of {name} was already pending, nothing changed: {when}; --replace replaces it")
    else:
        typer.echo(f"key {key!r} of {name} {'replaced' if due.replaced else 'added'}: {when}")


@app.command()
def cancel(name: QueueName, key: Annotated[str, typer.Argument(help="The key of the pending item.")],
           redis_url: RedisUrl = DEFAULT_URL) -> None:
    """Cancel the pending item of KEY. Exit 0 if it was pending (and is now gone), 1 if it was not."""
    if not _run(_on_queue(redis_url, name, lambda queue: queue.cancel(key))):
        typer.echo(f"key {key!r} of {name} was not pending: nothing cancelled")
        raise typer.Exit(1)
    typer.echo(f"cancelled key {key!r} of {name} (it was pending)")


async def _on_queue(url: str, name: str, call: Callable[[DelayedQueue[Any]], Awaitable[T]]) -> T:
    """``call(queue)`` on a queue object of ``name`` (never opened) on a client of ``url``."""
    async with connect(url) as client, with_queue(client, name) as queue:
        return await call(queue)


# -- pause, resume, rate-limit ------------------------------------------------------------------------


@app.command()
def pause(name: QueueName, redis_url: RedisUrl = DEFAULT_URL) -> None:
    """Pause every consumer of the queue, in every process, until `resume` (offers and transfers go on)."""
    _run(_on_queue(redis_url, name, lambda queue: queue.pause()))
    typer.echo(f"paused {name}: its consumers hand nothing out until 'aiodelayq resume {name}'")


@app.command()
def resume(name: QueueName, redis_url: RedisUrl = DEFAULT_URL) -> None:
    """Resume the consumers of a paused queue."""
    _run(_on_queue(redis_url, name, lambda queue: queue.resume()))
    typer.echo(f"resumed {name}")


@app.command("rate-limit")
def rate_limit(name: QueueName,
               rate: Annotated[str, typer.Argument(metavar="RATE", help="Items per second for all consumers "
                                                   "together: 100/s, 6000/min, 2.5 (per second), or off.")],
               burst: Annotated[int | None, typer.Option("--burst", min=1, help="Most items let out at once "
                                                         "(default: one second's worth).")] = None,
               redis_url: RedisUrl = DEFAULT_URL) -> None:
    """Limit how fast all consumers of the queue together get items (a token bucket on the server clock)."""
    try:
        per_second = parse_rate(rate)  # before connecting: a usage error
    except BadInput as exc:
        _fail(str(exc), 2)
    _run(_on_queue(redis_url, name, lambda queue: queue.set_rate_limit(per_second, burst)))
    typer.echo(f"rate limit of {name}: " + ("none" if per_second is None else f"{per_second:g}/s"))


# -- ls ----------------------------------------------------------------------------------------------


@app.command("ls")
def list_queues(match: Annotated[str, typer.Option("--match", help="Shell-style glob on the queue name.")] = "*",
                limit: Annotated[int, typer.Option("--limit", min=1, help="Stop after this many queues.")] = 1000,
                max_scan_calls: Annotated[int, typer.Option("--max-scan-calls", min=1, help="Most SCAN calls "
                                                            "(COUNT 1000) per key prefix.")] = 1000,
                redis_url: RedisUrl = DEFAULT_URL, as_json: AsJson = False) -> None:
    """Queues found by SCAN (pending, dead-letter and in-flight keys), with their counts."""
    _run(_ls(redis_url, match, limit, max_scan_calls, as_json))


async def _ls(url: str, match: str, limit: int, max_scan_calls: int, as_json: bool) -> None:
    async with connect(url) as client:
        found = await scan_queues(client, match, limit, max_scan_calls)
        rows, now_ms = await _snapshot(client, found.names)
    if as_json:
        print_json({"server_time_ms": now_ms, "match": match, "complete": found.complete, "note": found.note,
                    "queues": [counts_json(row, now_ms) for row in rows]})
        return
    summary = f"{len(rows)} queue(s)" + ("" if found.complete else f"; STOPPED EARLY: {found.note}")
    make_console().print(counts_table(rows, now_ms, title=f"queues matching {match!r}", caption=summary))


# -- dead letters ------------------------------------------------------------------------------------


@dead_letters_app.command("list")
def list_dead_letters(name: QueueName,
                      number: Annotated[int, typer.Option("-n", "--number", min=1, help="How many, oldest first.")]
                      = 20,
                      redis_url: RedisUrl = DEFAULT_URL, codec: CodecOpt = CodecName.JSON,
                      as_json: AsJson = False) -> None:
    """The oldest dead letters: when and why each died, its deliveries, its value."""
    _run(_list_dead_letters(redis_url, name, number, codec.value, as_json))


async def _list_dead_letters(url: str, name: str, number: int, codec: str, as_json: bool) -> None:
    async with connect(url) as client, with_queue(client, name, codec) as queue:
        letters = await queue.dead_letters(number)
        total = (await queue.counts()).dead_letters
        now_ms = await server_now_ms(client)
    if as_json:
        print_json({"queue": name, "server_time_ms": now_ms, "total": total,
                    "dead_letters": [dead_letter_json(letter) for letter in letters]})
        return
    table = dead_letters_table(letters, now_ms, title=f"{name}: dead letters, oldest first",
                               caption=f"{len(letters)} of {total} shown")
    make_console().print(table)


@dead_letters_app.command("requeue")
def requeue_dead_letters(name: QueueName,
                         limit: Annotated[int | None, typer.Option("--limit", min=1, help="How many, oldest first "
                                                                   "(default: all).")] = None,
                         delay: Annotated[float, typer.Option("--delay", min=0.0, help="Seconds until they are due.")]
                         = 0.0,
                         redis_url: RedisUrl = DEFAULT_URL) -> None:
    """Put the oldest dead letters back into the queue, due after --delay seconds, in order."""
    count = _run(_requeue(redis_url, name, limit, delay))
    typer.echo(f"requeued {count} dead letter(s) of {name}, due in {delay:g} s")


async def _requeue(url: str, name: str, limit: int | None, delay: float) -> int:
    async with connect(url) as client, with_queue(client, name) as queue:
        return await queue.requeue_dead_letters(limit, delay)


@dead_letters_app.command("purge")
def purge_dead_letters(name: QueueName,
                       yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")] = False,
                       redis_url: RedisUrl = DEFAULT_URL) -> None:
    """Delete a queue's dead-letter list (asks first, unless --yes)."""
    if not yes:
        total = _run(_dead_letter_count(redis_url, name))
        if total == 0:
            typer.echo(f"{name} has no dead letters")
            return
        # Asked outside any event loop and connection: a person may take a while to answer.
        typer.confirm(f"Delete the {total} dead letter(s) of {name}?", abort=True, err=True)
    count = _run(_purge(redis_url, name))
    typer.echo(f"purged {count} dead letter(s) of {name}")


async def _dead_letter_count(url: str, name: str) -> int:
    async with connect(url) as client, with_queue(client, name) as queue:
        return (await queue.counts()).dead_letters


async def _purge(url: str, name: str) -> int:
    async with connect(url) as client, with_queue(client, name) as queue:
        return await queue.purge_dead_letters()


# -- worker ------------------------------------------------------------------------------------------


@app.command()
def worker(target: Annotated[str, typer.Argument(metavar="MODULE:FUNC", help="The async handler of one item, "
                                                 "e.g. myapp.jobs:handle.")],
           queue: Annotated[str, typer.Option("--queue", help="The queue to consume.")],
           concurrency: Annotated[int, typer.Option("--concurrency", min=1, help="Items handled at once.")] = 16,
           visibility_timeout: Annotated[float, typer.Option("--visibility-timeout", min=0.1,
                                                             help="Seconds a received item stays invisible to "
                                                             "others (extended while the handler runs).")] = 30.0,
           max_deliveries: Annotated[int, typer.Option("--max-deliveries", min=0,
                                                       help="Dead-letter a failing item after this many "
                                                       "deliveries (0: no limit).")] = 5,
           drain_timeout: Annotated[float, typer.Option("--drain-timeout", min=0.0, help="Seconds running handlers "
                                                        "get to finish on SIGTERM/Ctrl-C.")] = 30.0,
           plain: Annotated[bool, typer.Option("--plain", help="At most once: take items (no acks); a failed "
                                               "item is logged and gone.")] = False,
           redis_url: RedisUrl = DEFAULT_URL, codec: CodecOpt = CodecName.JSON) -> None:
    """Consume a queue with a handler until SIGTERM/Ctrl-C, then drain (at-least-once, unless --plain)."""
    # Imported here: the worker is only this command's business. run_worker loads MODULE:FUNC itself,
    # prints its own one-line errors and returns the exit code.
    from ..worker import run_worker

    code = run_worker(target, queue=queue, redis_url=redis_url, max_deliveries=max_deliveries, codec=codec.value,
                      concurrency=concurrency, visibility_timeout_s=visibility_timeout, reliable=not plain,
                      drain_timeout_s=drain_timeout)
    raise typer.Exit(code)
