"""The ``aiodelayq`` commands (typer). Each command runs one coroutine on a new event loop (Ctrl-C
cancels it, as ``asyncio.run`` does from Python 3.11 on) with a fresh client (:func:`aiodelayq._admin.connect.connect`:
one server, any node of a Cluster, or a Sentinel-managed primary; closed at the end); failures the
operator can act on become one line on stderr: exit 1 for the server or the queue (unreachable,
refused, a :class:`DelayedQueueError`), exit 2 for a bad argument. Tables and results go to stdout,
prompts and progress to stderr.

This module imports typer and nothing heavy: redis-py, rich and the library's queue code are imported
by the commands that run, so ``aiodelayq --help`` starts fast. Help pages are written by
:mod:`._help`."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from enum import Enum
from typing import TYPE_CHECKING, Annotated, Any, NoReturn, TypeVar

import typer

from ._help import Command, Group

if TYPE_CHECKING:
    from rich.console import RenderableType

    from .._admin.connect import Target
    from .._admin.reads import QueueRow
    from .._queue import DelayedQueue
    from .._redis.connections import AnyRedis

__all__ = ["app"]

T = TypeVar("T")

DEFAULT_URL = "redis://localhost:6379/0"


class CodecName(str, Enum):
    """The built-in codecs a command can decode or encode with."""

    JSON = "json"
    STR = "str"
    BYTES = "bytes"
    MSGPACK = "msgpack"


def _seconds(minimum: float) -> Callable[[str], float]:
    """The parser of a ``SECONDS`` option: a finite number of seconds, at least ``minimum`` (the
    library's rule for durations); anything else (``inf``, ``nan``, text) is a usage error (exit 2)."""

    def parse(text: str) -> float:
        import math

        from .._core.checks import seconds_text

        try:
            value = float(text)
        except ValueError:
            raise typer.BadParameter(f"must be a number of seconds, not {text!r}") from None
        if not math.isfinite(value):
            raise typer.BadParameter(f"must be a finite number of seconds, not {text!r}")
        if value < minimum:
            raise typer.BadParameter(f"must be at least {seconds_text(minimum)}, not {text!r}")
        return value

    return parse


RedisUrl = Annotated[str, typer.Option("--redis-url", envvar="REDIS_URL", metavar="URL",
                                       help="The server: redis://, rediss:// (TLS) or unix://; for a Cluster, any "
                                       "node. With --sentinel, only its credentials, database and TLS count.")]
ClusterOpt = Annotated[bool, typer.Option("--cluster", help="The URL is a Cluster node (found out by itself with "
                                          "INFO cluster where INFO is allowed).")]
SentinelOpt = Annotated[list[str] | None, typer.Option("--sentinel", metavar="HOST:PORT",
                                                       help="A Sentinel to ask for the primary (repeatable); "
                                                       "needs --service.")]
ServiceOpt = Annotated[str | None, typer.Option("--service", metavar="NAME",
                                                help="The primary's name at the Sentinels (--sentinel).")]
CodecOpt = Annotated[CodecName, typer.Option("--codec", metavar="json|str|bytes|msgpack",
                                             help="How the queue's payloads are encoded.")]
AsJson = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON instead of a table.")]
QueueName = Annotated[str, typer.Argument(metavar="NAME", help="Queue name (the destination list, Redisson's queue "
                                          "name).")]
QueueNames = Annotated[list[str], typer.Argument(metavar="NAMES", help="Queue names.")]

# The app's help is _root's docstring. Unexpected exceptions (bugs) keep Python's plain traceback.
# No rich markup: help pages are ._help's plain text, usage errors click's plain lines.
app = typer.Typer(name="aiodelayq", cls=Group, no_args_is_help=True, add_completion=False,
                  pretty_exceptions_enable=False, rich_markup_mode=None)
dead_letters_app = typer.Typer(cls=Group, no_args_is_help=True, rich_markup_mode=None,
                               help="Read, requeue or purge a queue's dead-letter list.")
app.add_typer(dead_letters_app, name="dead-letters")


def _command(name: str | None = None, *, on: typer.Typer = app) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``@on.command(name)`` with the help pages of :class:`._help.Command`."""
    return on.command(name, cls=Command)


# -- running a command ---------------------------------------------------------------------------


def _fail(message: str, code: int) -> NoReturn:
    """One line on stderr, then exit ``code``: on call, a traceback is noise."""
    typer.echo("aiodelayq: " + " ".join(message.splitlines()), err=True)
    raise typer.Exit(code)


def _run(work: Coroutine[Any, Any, T], *, sigterm_interrupts: bool = False) -> T:
    """Run ``work`` on a new event loop (Ctrl-C cancels it, then raises KeyboardInterrupt, on every
    Python; with ``sigterm_interrupts`` SIGTERM does the same); expected failures become one line and
    an exit code."""
    import asyncio

    from redis.exceptions import ConnectionError as RedisConnectionError
    from redis.exceptions import RedisError

    from .._admin.connect import BadInput, CannotConnect
    from .._core.tasks import run_interruptible
    from ..exceptions import BackendError, DelayedQueueError, InvalidNameError, WrongNodeError

    terminated: list[bool] = []
    try:
        return run_interruptible(_interrupted_by_sigterm(work, terminated) if sigterm_interrupts else work)
    except asyncio.CancelledError:
        if not terminated:
            raise
        raise KeyboardInterrupt from None  # SIGTERM ended it, as Ctrl-C does
    except BadInput as exc:
        _fail(str(exc), 2)
    except CannotConnect as exc:
        _fail(str(exc), 1)
    except InvalidNameError as exc:
        _fail(str(exc), 2)
    except WrongNodeError as exc:  # a Cluster node that refused INFO: not recognised as one
        _fail(f"{exc} (here: add --cluster)", 1)
    except DelayedQueueError as exc:
        if isinstance(exc, BackendError) and isinstance(exc.__cause__, RedisConnectionError):
            _fail(f"lost the connection to the server: {exc}", 1)
        _fail(str(exc), 1)
    except RedisError as exc:  # the CLI's own commands (TIME, SCAN): refused, e.g. by an ACL
        _fail(f"redis error: {exc}", 1)


async def _interrupted_by_sigterm(work: Coroutine[Any, Any, T], terminated: list[bool]) -> T:
    """``await work``; SIGTERM cancels it (appending to ``terminated``) as Ctrl-C does, so it unwinds
    the same way. A second SIGTERM has its default effect."""
    import asyncio
    import signal

    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None

    def on_sigterm() -> None:
        terminated.append(True)
        loop.remove_signal_handler(signal.SIGTERM)
        task.cancel()

    loop.add_signal_handler(signal.SIGTERM, on_sigterm)
    try:
        return await work
    finally:
        loop.remove_signal_handler(signal.SIGTERM)


def _target(redis_url: str, cluster: bool, sentinel: list[str] | None, service: str | None) -> Target:
    """Where the command connects, from its connection options (a bad one: exit 2)."""
    from .._admin.connect import BadInput, Target
    from ._input import parse_sentinel

    try:
        nodes = tuple(parse_sentinel(text) for text in sentinel or ())
    except BadInput as exc:
        _fail(str(exc), 2)
    if service is not None and not nodes:
        _fail("--service needs --sentinel HOST:PORT (the Sentinels to ask)", 2)
    return Target(redis_url, cluster, nodes, service)


async def _snapshot(client: AnyRedis, names: Sequence[str],
                    shards: Mapping[str, int] | None = None) -> tuple[list[QueueRow], int]:
    """Each queue's counts and the server time they are shown against (``shards``: as
    :func:`~aiodelayq._admin.reads.queue_counts` takes them)."""
    from .._admin.reads import queue_counts, server_now_ms

    rows = await queue_counts(client, names, shards)
    return rows, await server_now_ms(client)


async def _note_if_unknown(client: AnyRedis, name: str, target: Target) -> None:
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


def _print_version(value: bool) -> None:
    """``--version``: eager, so it works without a command."""
    if value:
        from .. import __version__

        typer.echo(f"aiodelayq {__version__}")
        raise typer.Exit()


@app.callback()
def _root(version: Annotated[bool, typer.Option("--version", is_eager=True, callback=_print_version,
                                                help="Print the version and exit.")] = False) -> None:
    """Look at and operate aiodelayq / Redisson RDelayedQueue queues on Redis: one server, a Cluster
    (any node's URL) or a Sentinel-managed primary."""


# -- stats, watch ----------------------------------------------------------------------------------


@_command()
def stats(names: QueueNames, redis_url: RedisUrl = DEFAULT_URL, cluster: ClusterOpt = False,
          sentinel: SentinelOpt = None, service: ServiceOpt = None, as_json: AsJson = False) -> None:
    """Pending, ready, in-flight and dead-letter counts and the next due time of each queue."""
    _run(_stats(_target(redis_url, cluster, sentinel, service), names, as_json))


async def _stats(target: Target, names: Sequence[str], as_json: bool) -> None:
    from .._admin.connect import connect
    from ._render import counts_json, counts_table, make_console, print_json

    async with connect(target) as client:
        rows, now_ms = await _snapshot(client, names)
    if as_json:
        print_json({"server_time_ms": now_ms, "queues": [counts_json(row, now_ms) for row in rows]})
    else:
        make_console().print(counts_table(rows, now_ms))


@_command()
def watch(names: QueueNames, redis_url: RedisUrl = DEFAULT_URL, cluster: ClusterOpt = False,
          sentinel: SentinelOpt = None, service: ServiceOpt = None,
          interval: Annotated[float, typer.Option("--interval", parser=_seconds(0.1), metavar="SECONDS",
                                                  help="Seconds between refreshes (at least 0.1).")] = 2.0,
          count: Annotated[int | None, typer.Option("--count", min=1, metavar="N",
                                                    help="Stop after N refreshes.")] = None) -> None:
    """The stats table, refreshed live until Ctrl-C or SIGTERM (or --count refreshes)."""
    try:
        _run(_watch(_target(redis_url, cluster, sentinel, service), names, interval, count), sigterm_interrupts=True)
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


# -- peek, offer, cancel ---------------------------------------------------------------------------


@_command()
def peek(name: QueueName,
         number: Annotated[int, typer.Option("-n", "--number", min=1, max=1000, metavar="N",
                                             help="How many items (1 to 1000).")] = 20,
         redis_url: RedisUrl = DEFAULT_URL, cluster: ClusterOpt = False, sentinel: SentinelOpt = None,
         service: ServiceOpt = None, codec: CodecOpt = CodecName.JSON, as_json: AsJson = False) -> None:
    """The soonest-due pending items: due time, key, value (raw bytes when undecodable or malformed)."""
    _run(_peek(_target(redis_url, cluster, sentinel, service), name, number, codec.value, as_json))


async def _peek(target: Target, name: str, number: int, codec: str, as_json: bool) -> None:
    from .._admin.connect import connect
    from .._admin.reads import server_now_ms, with_queue
    from ._render import iso_utc, make_console, pending_json, pending_table, print_json

    async with connect(target) as client, with_queue(client, name, codec) as queue:
        items = await queue.peek(number)
        now_ms = await server_now_ms(client)
        if not items:
            await _note_if_unknown(client, name, target)
    if as_json:
        print_json({"queue": name, "server_time_ms": now_ms, "items": [pending_json(i, now_ms) for i in items]})
    else:
        table = pending_table(items, now_ms, title=f"{name}: {len(items)} soonest due",
                              caption=f"server time {iso_utc(now_ms)}")
        make_console().print(table)


@_command()
def offer(name: QueueName,
          value: Annotated[str, typer.Argument(metavar="VALUE", help="The item: JSON text for the json and msgpack "
                                               "codecs, text for str, the argument's bytes for bytes.")],
          delay: Annotated[float, typer.Option("--delay", parser=_seconds(0.0), metavar="SECONDS",
                                               help="Seconds until it is due.")] = 0.0,
          key: Annotated[str | None, typer.Option("--key", metavar="KEY",
                                                  help="Its key (unique among pending items).")] = None,
          replace: Annotated[bool, typer.Option("--replace", help="Replace the pending item of --key.")] = False,
          redis_url: RedisUrl = DEFAULT_URL, cluster: ClusterOpt = False, sentinel: SentinelOpt = None,
          service: ServiceOpt = None, codec: CodecOpt = CodecName.JSON) -> None:
    """Add an item, due after --delay seconds; prints its due time (and with --key what happened)."""
    _run(_offer(_target(redis_url, cluster, sentinel, service), name, value, delay, key, replace, codec.value))


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


@_command()
def cancel(name: QueueName, key: Annotated[str, typer.Argument(metavar="KEY", help="The key of the pending item.")],
           redis_url: RedisUrl = DEFAULT_URL, cluster: ClusterOpt = False, sentinel: SentinelOpt = None,
           service: ServiceOpt = None) -> None:
    """Cancel the pending item of KEY. Exit 0 if it was pending (and is now gone), 1 if it was not."""
    if not _run(_on_queue(_target(redis_url, cluster, sentinel, service), name, lambda queue: queue.cancel(key))):
        typer.echo(f"key {key!r} of {name} was not pending: nothing cancelled")
        raise typer.Exit(1)
    typer.echo(f"cancelled key {key!r} of {name} (it was pending)")


async def _on_queue(target: Target, name: str, call: Callable[[DelayedQueue[Any]], Awaitable[T]], *,
                    note_if_unknown: bool = False) -> T:
    """``call(queue)`` on a queue object of ``name`` (never opened) on a client of ``target``; first,
    with ``note_if_unknown``, a note when none of the queue's keys exists."""
    from .._admin.connect import connect
    from .._admin.reads import with_queue

    async with connect(target) as client, with_queue(client, name) as queue:
        if note_if_unknown:
            await _note_if_unknown(client, name, target)
        return await call(queue)


# -- pause, resume, rate-limit ------------------------------------------------------------------------


@_command()
def pause(name: QueueName, redis_url: RedisUrl = DEFAULT_URL, cluster: ClusterOpt = False,
          sentinel: SentinelOpt = None, service: ServiceOpt = None) -> None:
    """Pause every consumer of the queue, in every process, until `resume` (offers and transfers go on)."""
    _run(_on_queue(_target(redis_url, cluster, sentinel, service), name, lambda queue: queue.pause(),
                   note_if_unknown=True))
    typer.echo(f"paused {name}: its consumers hand nothing out until 'aiodelayq resume {name}'")


@_command()
def resume(name: QueueName, redis_url: RedisUrl = DEFAULT_URL, cluster: ClusterOpt = False,
           sentinel: SentinelOpt = None, service: ServiceOpt = None) -> None:
    """Resume the consumers of a paused queue."""
    _run(_on_queue(_target(redis_url, cluster, sentinel, service), name, lambda queue: queue.resume(),
                   note_if_unknown=True))
    typer.echo(f"resumed {name}")


@_command("rate-limit")
def rate_limit(name: QueueName,
               rate: Annotated[str, typer.Argument(metavar="RATE", help="Items per second for all consumers "
                                                   "together: 100/s, 6000/min, 2.5 (per second), or off.")],
               burst: Annotated[int | None, typer.Option("--burst", min=1, metavar="N", help="Most items let out "
                                                         "at once (default: one second's worth).")] = None,
               redis_url: RedisUrl = DEFAULT_URL, cluster: ClusterOpt = False, sentinel: SentinelOpt = None,
               service: ServiceOpt = None) -> None:
    """Limit how fast all consumers of the queue together get items (a token bucket on the server clock)."""
    from .._admin.connect import BadInput
    from ._input import parse_rate

    try:
        per_second = parse_rate(rate)  # before connecting: a usage error
    except BadInput as exc:
        _fail(str(exc), 2)
    _run(_on_queue(_target(redis_url, cluster, sentinel, service), name,
                   lambda queue: queue.set_rate_limit(per_second, burst), note_if_unknown=True))
    typer.echo(f"rate limit of {name}: " + ("none" if per_second is None else f"{per_second:g}/s"))


# -- ls ----------------------------------------------------------------------------------------------


@_command("ls")
def list_queues(match: Annotated[str, typer.Option("--match", metavar="GLOB",
                                                   help="Shell-style glob on the queue name.")] = "*",
                limit: Annotated[int, typer.Option("--limit", min=1, metavar="N",
                                                   help="Stop after N queues.")] = 1000,
                max_scan_calls: Annotated[int, typer.Option("--max-scan-calls", min=1, metavar="N",
                                                            help="Most SCAN calls (COUNT 1000) per key prefix "
                                                            "and server.")] = 1000,
                redis_url: RedisUrl = DEFAULT_URL, cluster: ClusterOpt = False, sentinel: SentinelOpt = None,
                service: ServiceOpt = None, as_json: AsJson = False) -> None:
    """Queues found by SCAN (pending, dead-letter and in-flight keys; every primary of a Cluster), with
    their counts."""
    _run(_ls(_target(redis_url, cluster, sentinel, service), match, limit, max_scan_calls, as_json))


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


# -- dead letters ------------------------------------------------------------------------------------


@_command("list", on=dead_letters_app)
def list_dead_letters(name: QueueName,
                      number: Annotated[int, typer.Option("-n", "--number", min=1, metavar="N",
                                                          help="How many, oldest first.")] = 20,
                      redis_url: RedisUrl = DEFAULT_URL, cluster: ClusterOpt = False, sentinel: SentinelOpt = None,
                      service: ServiceOpt = None, codec: CodecOpt = CodecName.JSON, as_json: AsJson = False) -> None:
    """The oldest dead letters: when and why each died, its deliveries, its value."""
    _run(_list_dead_letters(_target(redis_url, cluster, sentinel, service), name, number, codec.value, as_json))


async def _list_dead_letters(target: Target, name: str, number: int, codec: str, as_json: bool) -> None:
    from .._admin.connect import connect
    from .._admin.reads import server_now_ms, with_queue
    from ._render import dead_letter_json, dead_letters_table, make_console, print_json

    async with connect(target) as client, with_queue(client, name, codec) as queue:
        letters = await queue.dead_letters(number)
        total = (await queue.counts()).dead_letters
        now_ms = await server_now_ms(client)
        if not total:
            await _note_if_unknown(client, name, target)
    if as_json:
        print_json({"queue": name, "server_time_ms": now_ms, "total": total,
                    "dead_letters": [dead_letter_json(letter) for letter in letters]})
        return
    table = dead_letters_table(letters, now_ms, title=f"{name}: dead letters, oldest first",
                               caption=f"{len(letters)} of {total} shown")
    make_console().print(table)


@_command("requeue", on=dead_letters_app)
def requeue_dead_letters(name: QueueName,
                         limit: Annotated[int | None, typer.Option("--limit", min=1, metavar="N",
                                                                   help="How many, oldest first (default: "
                                                                   "all).")] = None,
                         delay: Annotated[float, typer.Option("--delay", parser=_seconds(0.0), metavar="SECONDS",
                                                              help="Seconds until they are due.")] = 0.0,
                         redis_url: RedisUrl = DEFAULT_URL, cluster: ClusterOpt = False,
                         sentinel: SentinelOpt = None, service: ServiceOpt = None) -> None:
    """Put the oldest dead letters back into the queue, due after --delay seconds, in order."""
    count = _run(_on_queue(_target(redis_url, cluster, sentinel, service), name,
                           lambda queue: queue.requeue_dead_letters(limit, delay)))
    typer.echo(f"requeued {count} dead letter(s) of {name}, due in {delay:g} s")


@_command("purge", on=dead_letters_app)
def purge_dead_letters(name: QueueName,
                       yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")] = False,
                       redis_url: RedisUrl = DEFAULT_URL, cluster: ClusterOpt = False, sentinel: SentinelOpt = None,
                       service: ServiceOpt = None) -> None:
    """Delete a queue's dead-letter list (asks first, unless --yes)."""
    target = _target(redis_url, cluster, sentinel, service)
    if not yes:
        total = _run(_on_queue(target, name, _dead_letter_count))
        if total == 0:
            typer.echo(f"{name} has no dead letters")
            return
        # Asked outside any event loop and connection: a person may take a while to answer.
        typer.confirm(f"Delete the {total} dead letter(s) of {name}?", abort=True, err=True)
    count = _run(_on_queue(target, name, lambda queue: queue.purge_dead_letters()))
    typer.echo(f"purged {count} dead letter(s) of {name}")


async def _dead_letter_count(queue: DelayedQueue[Any]) -> int:
    return (await queue.counts()).dead_letters


# -- doctor, dashboard --------------------------------------------------------------------------------


class WireFormatName(str, Enum):
    """What the queues' producers write (``DelayedQueue(wire_format=...)``)."""

    REDISSON = "redisson"
    LEGACY = "redisson-legacy"


@_command()
def doctor(names: Annotated[list[str] | None, typer.Argument(metavar="NAMES", help="Queues to check (default: "
                                                             "the queues SCAN finds, up to 100).")] = None,
           max_lag: Annotated[float, typer.Option("--max-lag", parser=_seconds(0.0), metavar="SECONDS",
                                                  help="A queue whose due items wait longer fails.")] = 60.0,
           max_skew: Annotated[float, typer.Option("--max-skew", parser=_seconds(0.0), metavar="SECONDS",
                                                   help="Warn when this machine's clock is further off the "
                                                   "server's.")] = 1.0,
           wire_format: Annotated[WireFormatName, typer.Option("--wire-format", metavar="redisson|redisson-legacy",
                                                               help="What the queues' producers write.")]
           = WireFormatName.REDISSON,
           acl_user: Annotated[str | None, typer.Option("--acl-user", metavar="NAME",
                                                        help="Check this user's ACL (default: the URL's user; "
                                                        "needs ACL DRYRUN).")] = None,
           redis_url: RedisUrl = DEFAULT_URL, cluster: ClusterOpt = False, sentinel: SentinelOpt = None,
           service: ServiceOpt = None, as_json: AsJson = False) -> None:
    """Check a deployment: eviction policy, persistence, replication, server version and commands,
    clock, and per queue the ACL, lag and element format. One line per check; exit 1 when one
    fails (warnings do not fail)."""
    failed = _run(_doctor(_target(redis_url, cluster, sentinel, service), names, max_lag, max_skew,
                          wire_format.value, acl_user, as_json))
    raise typer.Exit(1 if failed else 0)


async def _doctor(target: Target, names: list[str] | None, max_lag_s: float, max_skew_s: float, wire_format: str,
                  acl_user: str | None, as_json: bool) -> bool:
    from .._admin.connect import connect
    from .._admin.scan import scan_queues
    from ._doctor import diagnose
    from ._render import doctor_lines, print_json

    async with connect(target) as client:
        if not names:
            names = (await scan_queues(client, "*", 100, 100)).names
        findings = await diagnose(client, names, max_lag_s=max_lag_s, max_skew_s=max_skew_s,
                                  wire_format=wire_format, acl_user=acl_user)
    failed = any(f.status == "fail" for f in findings)
    if as_json:
        print_json({"ok": not failed, "findings": [vars(f) for f in findings]})
    else:
        for line in doctor_lines(findings):
            typer.echo(line)
    return failed


@_command()
def dashboard(host: Annotated[str, typer.Option("--host", metavar="ADDRESS",
                                                help="The address to listen on (beyond loopback, a token is "
                                                "required).")] = "127.0.0.1",
              port: Annotated[int, typer.Option("--port", min=0, max=65535, metavar="PORT",
                                                help="The port to listen on (0: any free one).")] = 8000,
              read_only: Annotated[bool, typer.Option("--read-only", help="No write buttons: nothing can be "
                                                      "changed.")] = False,
              names: Annotated[list[str] | None, typer.Option("--queue", metavar="NAME",
                                                              help="Show this queue (repeatable; default: the "
                                                              "queues SCAN finds).")] = None,
              token: Annotated[str | None, typer.Option("--token", envvar="AIODELAYQ_DASHBOARD_TOKEN",
                                                        metavar="TOKEN",
                                                        help="Every request needs this token (16+ characters; "
                                                        "a bearer token or the login form's). Beyond loopback "
                                                        "one is required: without it, one is made and printed. "
                                                        "Prefer the env var: arguments show in ps.")] = None,
              redis_url: RedisUrl = DEFAULT_URL, cluster: ClusterOpt = False, sentinel: SentinelOpt = None,
              service: ServiceOpt = None) -> None:
    """Serve the web dashboard of the queues until Ctrl-C or SIGTERM (docs: Dashboard)."""
    import logging

    try:
        from ..dashboard import CannotListen, serve
        from ..dashboard._auth import check_token
    except ImportError as exc:  # the extra is missing: its message says what to install
        _fail(str(exc), 2)
    from ..exceptions import ConfigurationError

    if token is not None:
        try:
            check_token(token, "--token (or AIODELAYQ_DASHBOARD_TOKEN)")
        except ConfigurationError as exc:
            _fail(str(exc), 2)

    # The dashboard's one INFO line says where it listens (the port it got, with --port 0).
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    logging.getLogger("aiodelayq").setLevel(logging.INFO)
    try:
        _run(serve(_target(redis_url, cluster, sentinel, service), host, port, read_only, queues=names,
                   token=token))
    except CannotListen as exc:
        _fail(str(exc), 1)
    except KeyboardInterrupt:  # Ctrl-C is how it ends: exit 0
        raise typer.Exit(0) from None


# -- worker ------------------------------------------------------------------------------------------


@_command()
def worker(target: Annotated[str, typer.Argument(metavar="MODULE:FUNC", help="The async handler of one item, "
                                                 "e.g. myapp.jobs:handle.")],
           queue: Annotated[str, typer.Option("--queue", metavar="NAME", help="The queue to consume.")],
           concurrency: Annotated[int, typer.Option("--concurrency", min=1, metavar="N",
                                                    help="Items handled at once.")] = 16,
           visibility_timeout: Annotated[float, typer.Option("--visibility-timeout", parser=_seconds(0.1),
                                                             metavar="SECONDS",
                                                             help="Seconds a received item stays invisible to "
                                                             "others (extended while the handler runs).")] = 30.0,
           max_deliveries: Annotated[int, typer.Option("--max-deliveries", min=0, metavar="N",
                                                       help="Dead-letter a failing item after N deliveries "
                                                       "(0: no limit).")] = 5,
           drain_timeout: Annotated[float, typer.Option("--drain-timeout", parser=_seconds(0.0), metavar="SECONDS",
                                                        help="Seconds running handlers get to finish on "
                                                        "SIGTERM/Ctrl-C.")] = 30.0,
           plain: Annotated[bool, typer.Option("--plain", help="At most once: take items (no acks); a failed "
                                               "item is logged and gone.")] = False,
           redis_url: RedisUrl = DEFAULT_URL, cluster: ClusterOpt = False, sentinel: SentinelOpt = None,
           service: ServiceOpt = None, codec: CodecOpt = CodecName.JSON) -> None:
    """Consume a queue with a handler until SIGTERM/Ctrl-C, then drain (at-least-once, unless --plain):
    on one server, a Cluster (any node's URL) or a Sentinel-managed primary."""
    where = _target(redis_url, cluster, sentinel, service)
    # Imported here: the worker is only this command's business. run_worker loads MODULE:FUNC itself,
    # prints its own one-line errors and returns the exit code.
    from .._admin.connect import BadInput, CannotConnect, connect
    from ..worker import run_worker

    try:
        code = run_worker(target, queue=queue, redis_url=redis_url, max_deliveries=max_deliveries,
                          codec=codec.value, concurrency=concurrency, visibility_timeout_s=visibility_timeout,
                          reliable=not plain, drain_timeout_s=drain_timeout, connect=lambda: connect(where))
    except BadInput as exc:
        _fail(str(exc), 2)
    except CannotConnect as exc:
        _fail(str(exc), 1)
    raise typer.Exit(code)
