"""What the commands do to Redis, without typer or rich: connect, read the server clock, count queues,
find queues by ``SCAN``, and turn command-line text into items. Every read here is bounded and
read-only (``PING``, ``TIME``, ``SCAN`` and the queue's read-only calls)."""

from __future__ import annotations

import asyncio
import contextlib
import fnmatch
import json
import math
import os
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .._core.urls import redact
from .._producing.pending import QueueCounts
from .._queue import DelayedQueue
from .._redis.retry import call_idempotent
from .._wire.key_names import prefix_name

__all__ = ["QUEUE_KEY_PREFIXES", "BadInput", "CannotConnect", "QueueRow", "ScanResult", "connect", "parse_rate",
           "parse_value", "queue_counts", "queue_name_of", "redact", "scan_queues", "server_now_ms", "with_queue"]

# The keys whose names reveal a queue: its pending zset, and the two lists a queue can keep when
# nothing is pending (dead letters, in-flight messages). The destination list has the bare name and
# cannot be told apart from any other list.
QUEUE_KEY_PREFIXES = ("redisson_delay_queue_timeout", "aiodelayq_dead_letter", "aiodelayq_in_flight")

# Connect and reply bounds of the CLI's own commands (PING, TIME, SCAN); the queue's calls have their
# own (call_timeout_s). A URL's own socket_timeout/socket_connect_timeout win over these.
CONNECT_TIMEOUT_S = 5.0
SOCKET_TIMEOUT_S = 10.0

# Queues counted at once by `stats`/`ls`: enough to hide round trips, few enough connections.
COUNT_CONCURRENCY = 16


class CannotConnect(Exception):
    """The server at ``url`` (password masked) could not be reached; ``reason`` says why."""

    def __init__(self, url: str, reason: str) -> None:
        super().__init__(f"cannot connect to {url}: {reason}")
        self.url = url
        self.reason = reason


class BadInput(Exception):
    """A command-line argument the command cannot use (a usage error, exit code 2)."""


@dataclass(frozen=True)
class QueueRow:
    """One queue's counts as ``stats``, ``watch`` and ``ls`` show them."""

    name: str
    counts: QueueCounts


@dataclass(frozen=True)
class ScanResult:
    """Queue names found by :func:`scan_queues`.

    Attributes:
        names: sorted queue names.
        complete: ``False`` when the scan stopped before the end of the keyspace.
        note: why it stopped early (``None`` when complete).
    """

    names: list[str]
    complete: bool
    note: str | None


@contextlib.asynccontextmanager
async def connect(url: str) -> AsyncIterator[Redis]:
    """A client on ``url`` that answered a ``PING``; closed on exit.

    Raises:
        BadInput: ``url`` is not a Redis URL.
        CannotConnect: the server cannot be reached (refused, unknown host, timeout, bad password).
    """
    try:
        client = Redis.from_url(url, socket_connect_timeout=CONNECT_TIMEOUT_S, socket_timeout=SOCKET_TIMEOUT_S)
    except ValueError as exc:
        raise BadInput(f"bad --redis-url {redact(url)}: {exc}") from None
    try:
        try:
            await client.ping()
        except (RedisConnectionError, RedisTimeoutError, OSError) as exc:
            # One PING first, so an unreachable server is one clear line, not a queue call's
            # resends for call_timeout_s. AuthenticationError is a ConnectionError: said here too.
            raise CannotConnect(redact(url), str(exc) or type(exc).__name__) from None
        yield client
    finally:
        await client.aclose()


@contextlib.asynccontextmanager
async def with_queue(client: Redis, name: str, codec: str = "bytes") -> AsyncIterator[DelayedQueue[Any]]:
    """A queue object on ``client``, never opened (no subscription, no scheduler: the CLI only reads
    and writes), closed on exit. ``codec`` only matters where items are decoded or encoded."""
    queue: DelayedQueue[Any] = DelayedQueue(client, name, codec=codec)
    try:
        yield queue
    finally:
        await queue.aclose()


async def server_now_ms(client: Redis) -> int:
    """The server's clock in epoch ms: due times are on it, so "in 12 s" must be too."""
    seconds, micros = await call_idempotent(client, "TIME", what="TIME", timeout_s=SOCKET_TIMEOUT_S)
    return int(seconds) * 1000 + int(micros) // 1000


async def queue_counts(client: Redis, names: Iterable[str]) -> list[QueueRow]:
    """``counts()`` of each queue (one atomic read-only call each, a few at a time), in input order."""
    gate = asyncio.Semaphore(COUNT_CONCURRENCY)

    async def one(name: str) -> QueueRow:
        async with gate, with_queue(client, name) as queue:
            return QueueRow(name, await queue.counts())

    return list(await asyncio.gather(*(one(name) for name in names)))


def queue_name_of(key: str, prefix: str) -> str | None:
    """The queue whose ``prefix`` key is ``key`` (the inverse of ``prefix_name``), or ``None``.

    ``prefix:{orders}`` is the queue ``orders`` (prefix_name added the braces); ``prefix:{a}b`` is the
    queue ``{a}b`` (a name with braces of its own is used as is). ``prefix:{x}`` is also the key of a
    queue literally named ``{x}``: it reads as ``x``, the usual case.
    """
    head = prefix + ":"
    if not key.startswith(head):
        return None
    rest = key[len(head):]
    inner = rest[1:-1]
    wrapped = rest.startswith("{") and rest.endswith("}") and bool(inner) and "{" not in inner and "}" not in inner
    name = inner if wrapped else rest
    # Only a name that maps back to this very key is a queue's (e.g. `prefix:plain` is nobody's).
    return name if name and prefix_name(prefix, name) == key else None


async def scan_queues(client: Redis, match: str, limit: int, max_calls: int) -> ScanResult:
    """Queue names matching the glob ``match`` found by ``SCAN ... COUNT 1000`` of the keys in
    :data:`QUEUE_KEY_PREFIXES`: at most ``max_calls`` SCAN calls per prefix, and at most ``limit`` names
    (the first ``limit`` by name of the ``limit + 1`` found when there are more).
    Read-only; each call costs the server about as much as 1,000 keys."""
    found: set[str] = set()
    for prefix in QUEUE_KEY_PREFIXES:
        cursor, calls = 0, 0
        while True:
            cursor, keys = await client.scan(cursor, match=f"{prefix}:*", count=1000)
            calls += 1
            for raw in keys:
                name = _name_from_raw(raw, prefix)
                if name is not None and fnmatch.fnmatchcase(name, match):
                    found.add(name)
                    if len(found) > limit:  # one more than asked: there is more to list, say so
                        return ScanResult(sorted(found)[:limit], False, f"more than --limit {limit} queues")
            if cursor == 0:
                break
            if calls >= max_calls:
                return ScanResult(sorted(found), False,
                                  f"stopped after {max_calls} SCAN calls over {prefix}:* (a large keyspace); "
                                  f"raise --max-scan-calls to look further")
    return ScanResult(sorted(found), True, None)


def _name_from_raw(raw: bytes | str, prefix: str) -> str | None:
    try:
        key = raw.decode() if isinstance(raw, bytes) else raw
    except UnicodeDecodeError:
        return None  # queue names are str, sent as UTF-8: this key is not one of ours
    return queue_name_of(key, prefix)


_PER = {"s": 1.0, "sec": 1.0, "second": 1.0, "m": 60.0, "min": 60.0, "minute": 60.0, "h": 3600.0, "hour": 3600.0}


def parse_rate(text: str) -> float | None:
    """Items per second of a command-line ``RATE``: ``100/s``, ``6000/min``, ``10/h``, ``2.5`` (per
    second), or ``off``/``none`` (no limit).

    Raises:
        BadInput: anything else, or a rate that is not above 0.
    """
    spec = text.strip().lower()
    if spec in ("off", "none"):
        return None
    number, _, unit = spec.partition("/")
    try:
        value = float(number)
    except ValueError:
        value = math.nan
    per = _PER.get(unit or "s")
    if per is None or not math.isfinite(value) or value <= 0:
        raise BadInput(f"RATE must be like 100/s, 6000/min, 10/h, 2.5 or off, not {text!r}")
    return value / per


def parse_value(text: str, codec: str) -> Any:
    """The item a command-line ``VALUE`` stands for under ``codec``.

    ``json`` and ``msgpack``: the text parsed as JSON (so ``'{"order": 1}'`` is a dict and a string
    needs its quotes); ``str``: the text; ``bytes``: the argument's bytes as the OS passed them.

    Raises:
        BadInput: the text is not JSON for a JSON-based codec.
    """
    if codec == "str":
        return text
    if codec == "bytes":
        return os.fsencode(text)  # undoes the surrogateescape decoding of argv: the exact bytes
    try:
        return json.loads(text)
    except ValueError as exc:
        raise BadInput(f"VALUE is not JSON ({exc}); the {codec} codec takes JSON text: quote a string as "
                       f"'\"text\"', or use --codec str") from None
