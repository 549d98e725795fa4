"""What the commands do to Redis, without typer or rich: connect (to one server, a Cluster, or a
Sentinel-managed primary), read the server clock, count queues, find queues by ``SCAN``, and turn
command-line text into items. Every read here is bounded and read-only (``PING``, ``INFO``, ``TIME``,
``SCAN``, ``EXISTS`` and the queue's read-only calls)."""

from __future__ import annotations

import asyncio
import contextlib
import fnmatch
import json
import math
import os
import re
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.connection import SSLConnection, parse_url
from redis.asyncio.sentinel import MasterNotFoundError, Sentinel
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisClusterException, RedisError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .._core.urls import redact
from .._producing.pending import QueueCounts
from .._queue import DelayedQueue
from .._redis.connections import AnyRedis
from .._redis.retry import call_idempotent
from .._wire.key_names import QueueKeys, prefix_name
from .._wire.placement import ShardRecord, shard_name_parts
from ..exceptions import InvalidNameError

__all__ = ["COUNT_CONCURRENCY", "QUEUE_KEY_PREFIXES", "BadInput", "CannotConnect", "QueueRow", "ScanResult", "Target",
           "connect", "format_duration", "parse_rate", "parse_sentinel", "parse_value", "queue_counts", "queue_exists",
           "queue_name_of", "recorded_shards", "redact", "scan_queues", "server_now_ms", "with_queue"]

# The keys whose names reveal a queue: its pending zset, its tier index (all its pending items may be
# tiered), and the two lists a queue can keep when nothing is pending (dead letters, in-flight
# messages). The destination list has the bare name and cannot be told apart from any other list.
QUEUE_KEY_PREFIXES = ("redisson_delay_queue_timeout", "aiodelayq_tier_index", "aiodelayq_dead_letter",
                      "aiodelayq_in_flight")

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


SENTINEL_PORT = 26379


@dataclass(frozen=True)
class Target:
    """Where a command connects.

    Attributes:
        url: a server's URL (``redis://``, ``rediss://``, ``unix://``): one server, or any node of a
            Cluster. With ``sentinels``, only its username, password, database, TLS (``rediss://``)
            and query options count, for the primary.
        cluster: treat ``url`` as a Cluster node without asking it (``INFO cluster`` otherwise).
        sentinels: ``(host, port)`` of the Sentinels to ask for the primary of ``service``.
        service: the name the Sentinels monitor the primary under.
    """

    url: str
    cluster: bool = False
    sentinels: tuple[tuple[str, int], ...] = ()
    service: str | None = None

    def __str__(self) -> str:
        """Where it connects, for messages (a password shown as ``***``)."""
        if self.sentinels:
            nodes = ",".join(f"{host}:{port}" for host, port in self.sentinels)
            return f"Sentinel service {self.service!r} via {nodes}"
        return redact(self.url)


def parse_sentinel(text: str) -> tuple[str, int]:
    """``(host, port)`` of a ``--sentinel`` value: ``host:port``, ``host`` (port 26379) or
    ``[ipv6]:port``.

    Raises:
        BadInput: an empty host or a port that is not a number from 1 to 65535.
    """
    host, port_text = text.strip(), ""
    if host.startswith("["):
        inner, _, rest = host[1:].partition("]")
        host, port_text = inner, rest.removeprefix(":")
    elif host.count(":") == 1:
        host, _, port_text = host.partition(":")
    try:
        port = int(port_text) if port_text else SENTINEL_PORT
    except ValueError:
        port = 0
    if not host or not 0 < port < 65536:
        raise BadInput(f"--sentinel must be HOST:PORT (e.g. sentinel-1:26379), not {text!r}")
    return host, port


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
        shards: the shard count of each sharded queue among ``names``, as recorded under its name
            (the other names are ordinary queues': found by keys of their own, which a sharded
            queue's name does not have).
    """

    names: list[str]
    complete: bool
    note: str | None
    shards: dict[str, int] = field(default_factory=dict)


@contextlib.asynccontextmanager
async def connect(target: Target) -> AsyncIterator[AnyRedis]:
    """A client of ``target`` that answered a ``PING``, closed on exit: a ``RedisCluster`` when
    ``target.cluster`` or when the server's ``INFO cluster`` says ``cluster_enabled:1``, a
    Sentinel-managed client with ``target.sentinels``, a plain ``Redis`` otherwise.

    Raises:
        BadInput: ``target.url`` is not a Redis URL, or the options do not fit together.
        CannotConnect: the server cannot be reached (refused, unknown host, timeout, bad password,
            no Sentinel answers or none knows the service).
    """
    if target.sentinels:
        async with _sentinel_client(target) as client:
            yield client
        return
    try:
        client = Redis.from_url(target.url, socket_connect_timeout=CONNECT_TIMEOUT_S, socket_timeout=SOCKET_TIMEOUT_S)
    except ValueError as exc:
        raise BadInput(f"bad --redis-url {redact(target.url)}: {exc}") from None
    try:
        await _ping(client, target)
        cluster = target.cluster or await _cluster_enabled(client)
    except BaseException:
        await client.aclose()
        raise
    if cluster:
        await client.aclose()
        async with _cluster_client(target) as cluster_client:
            yield cluster_client
        return
    try:
        yield client
    finally:
        await client.aclose()


async def _ping(client: Redis, target: Target) -> None:
    """One PING first, so an unreachable server is one clear line, not a queue call's resends for
    call_timeout_s. AuthenticationError is a ConnectionError: said here too."""
    try:
        await client.ping()
    except (RedisConnectionError, RedisTimeoutError, ResponseError, OSError) as exc:
        # ResponseError: the connection's own set-up refused (SELECT of a database a Cluster lacks).
        raise CannotConnect(str(target), _reason(exc)) from None


def _reason(exc: BaseException) -> str:
    """Why connecting failed, one line: a Sentinel's "no master found" without the reprs of every
    Sentinel client it tried, naming those that did not answer instead."""
    text = str(exc) or type(exc).__name__
    head, _, errors = text.partition(" : ")
    if not isinstance(exc, MasterNotFoundError) or not errors:
        return text
    silent = [f"{host}:{port}" for host, port in re.findall(r"host=([^,\s]+),port=(\d+)", errors)]
    return f"{head}; no answer from " + (", ".join(silent) if silent else "a Sentinel")


async def _cluster_enabled(client: Redis) -> bool:
    """Whether the server is a Cluster node (``INFO cluster``); ``False`` when ``INFO`` is refused
    (an ACL without it: ``--cluster`` says so instead)."""
    try:
        info = await client.info("cluster")
    except ResponseError:
        return False
    return bool(info.get("cluster_enabled"))


@contextlib.asynccontextmanager
async def _cluster_client(target: Target) -> AsyncIterator[RedisCluster]:
    try:
        client = RedisCluster.from_url(target.url, socket_connect_timeout=CONNECT_TIMEOUT_S,
                                       socket_timeout=SOCKET_TIMEOUT_S)
    except (ValueError, RedisClusterException) as exc:
        raise BadInput(f"bad --redis-url {redact(target.url)} for a cluster: {exc}") from None
    try:
        try:
            await client.initialize()  # reads the slot map: every primary is known from here on
        except (RedisError, OSError) as exc:
            raise CannotConnect(f"{target} (cluster)", str(exc) or type(exc).__name__) from None
        yield client
    finally:
        await client.aclose()


@contextlib.asynccontextmanager
async def _sentinel_client(target: Target) -> AsyncIterator[Redis]:
    if not target.service:
        raise BadInput("--sentinel needs --service NAME (the name the Sentinels monitor the primary under)")
    if target.cluster:
        raise BadInput("--cluster and --sentinel exclude each other")
    try:
        options: dict[str, Any] = dict(parse_url(target.url))
    except ValueError as exc:
        raise BadInput(f"bad --redis-url {redact(target.url)}: {exc}") from None
    connection_class = options.pop("connection_class", None)
    if "path" in options:
        raise BadInput("with --sentinel, --redis-url gives the primary's credentials and database: "
                       "redis:// or rediss://, not unix://")
    for where in ("host", "port"):
        options.pop(where, None)  # the Sentinels name the primary
    options.setdefault("socket_connect_timeout", CONNECT_TIMEOUT_S)
    options.setdefault("socket_timeout", SOCKET_TIMEOUT_S)
    timeouts = {"socket_connect_timeout": CONNECT_TIMEOUT_S, "socket_timeout": SOCKET_TIMEOUT_S}
    sentinel = Sentinel(list(target.sentinels), sentinel_kwargs=timeouts)  # type: ignore[no-untyped-call]
    try:
        client = sentinel.master_for(target.service, ssl=connection_class is SSLConnection, **options)
        try:
            await _ping(client, target)
            yield client
        finally:
            await client.aclose()
    finally:
        await sentinel.aclose()


@contextlib.asynccontextmanager
async def with_queue(client: AnyRedis, name: str, codec: str = "bytes",
                     shards: int | None = None) -> AsyncIterator[DelayedQueue[Any]]:
    """A queue object on ``client``, never opened (no subscription, no scheduler: the CLI only reads
    and writes), closed on exit; a sharded queue's with the shard count recorded under its name, so
    every command covers all its shards (``shards``: that count when the caller knows it, else
    :func:`recorded_shards` reads it). ``codec`` only matters where items are decoded or encoded."""
    if shards is None:
        shards = (await recorded_shards(client, name)).count
    queue: DelayedQueue[Any] = DelayedQueue(client, name, codec=codec, shards=shards)
    try:
        yield queue
    finally:
        await queue.aclose()


async def recorded_shards(client: AnyRedis, name: str) -> ShardRecord:
    """What the queue name ``name`` records about its shards (one ``HGET`` of its controls hash):
    their count and placement (``_wire/placement.py``); a count of 1 for an ordinary queue's name, a
    name with a brace (never sharded) or a record this release cannot read."""
    if "{" in name or "}" in name:
        return ShardRecord(1)
    controls = QueueKeys.for_name(name).controls
    raw = await call_idempotent(client, "HGET", controls, "shards", what=f"the shard count of {name!r}",
                                timeout_s=SOCKET_TIMEOUT_S, route=controls)
    return ShardRecord.parse(raw) or ShardRecord(1)


async def server_now_ms(client: AnyRedis, route: str | None = None) -> int:
    """The server's clock in epoch ms: due times are on it, so "in 12 s" must be too. ``route``: a
    key whose node answers (on a Cluster, the queue's own clock)."""
    seconds, micros = await call_idempotent(client, "TIME", what="TIME", timeout_s=SOCKET_TIMEOUT_S, route=route)
    return int(seconds) * 1000 + int(micros) // 1000


def format_duration(ms: float | None) -> str:
    """A duration for people: ``340 ms``, ``4.2 s``, ``3 min 05 s``, ``2 h 05 min``, ``3 d 4 h`` (``-``
    for ``None``)."""
    if ms is None or not math.isfinite(ms):
        return "-"
    ms = abs(ms)
    if ms < 1000:
        return f"{ms:.0f} ms"
    s = ms / 1000
    if s < 60:
        return f"{s:.1f} s"
    s_int = int(s)
    if s_int < 3600:
        return f"{s_int // 60} min {s_int % 60:02d} s"
    if s_int < 86400:
        return f"{s_int // 3600} h {s_int % 3600 // 60:02d} min"
    return f"{s_int // 86400} d {s_int % 86400 // 3600} h"


async def queue_counts(client: AnyRedis, names: Iterable[str],
                       shards: Mapping[str, int] | None = None) -> list[QueueRow]:
    """``counts()`` of each queue (one atomic read-only call each, a few at a time), in input order.
    ``shards``: the shard counts of the sharded ones (:attr:`ScanResult.shards`; a name it lacks is
    an ordinary queue's), else each queue's is read first."""
    gate = asyncio.Semaphore(COUNT_CONCURRENCY)

    async def one(name: str) -> QueueRow:
        async with gate, with_queue(client, name, shards=None if shards is None else shards.get(name, 1)) as queue:
            return QueueRow(name, await queue.counts())

    return list(await asyncio.gather(*(one(name) for name in names)))


async def queue_exists(client: AnyRedis, name: str) -> bool:
    """Whether any key of the queue ``name`` exists (one ``EXISTS``; a queue's keys share one
    cluster slot). ``False`` for a misspelt name, and also for an idle queue: a queue with nothing
    pending, ready, in flight or dead and no controls keeps no key at all."""
    keys = QueueKeys.for_name(name)
    found = await call_idempotent(client, "EXISTS", *keys.all, what=f"EXISTS of {name!r}'s keys",
                                  timeout_s=SOCKET_TIMEOUT_S, route=keys.timeout_set)
    return bool(found)


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


async def scan_queues(client: AnyRedis, match: str, limit: int, max_calls: int) -> ScanResult:
    """Queue names matching the glob ``match`` found by ``SCAN ... COUNT 1000`` of the keys in
    :data:`QUEUE_KEY_PREFIXES` (on a Cluster, on every primary): at most ``max_calls`` SCAN calls per
    prefix and server, and at most ``limit`` names (the first ``limit`` by name of the ``limit + 1``
    found when there are more). On a Cluster, a name whose keys would not all hash to one slot is
    no queue's (:meth:`QueueKeys.check_one_slot`) and left out. Read-only; each call costs the
    server about as much as 1,000 keys."""
    found: set[str] = set()
    cluster = isinstance(client, RedisCluster)
    nodes: Sequence[Any] = client.get_primaries() if isinstance(client, RedisCluster) else [None]

    def wanted(name: str) -> bool:  # the name, or the sharded queue it may be a shard of, matches
        if cluster and not _one_slot(name):
            return False  # keys in several slots: no queue of this name can work on a cluster
        parts = shard_name_parts(name)
        return fnmatch.fnmatchcase(name, match) or (parts is not None and fnmatch.fnmatchcase(parts[0], match))

    for prefix in QUEUE_KEY_PREFIXES:
        for node in nodes:
            cursor, calls = 0, 0
            while True:
                cursor, keys = await _scan_page(client, node, cursor, f"{prefix}:*")
                calls += 1
                for raw in keys:
                    name = _name_from_raw(raw, prefix)
                    if name is not None and wanted(name):
                        found.add(name)
                        if len(found) > limit:  # one more than asked: there may be more to list
                            found, shards = await _whole_queues(client, found, match)
                            if len(found) > limit:
                                names = sorted(found)[:limit]
                                return ScanResult(names, False, f"more than --limit {limit} queues",
                                                  {name: shards[name] for name in names if name in shards})
                if cursor == 0:
                    break
                if calls >= max_calls:
                    where = "" if node is None else f" on {node.name}"
                    found, shards = await _whole_queues(client, found, match)
                    return ScanResult(sorted(found), False,
                                      f"stopped after {max_calls} SCAN calls over {prefix}:*{where} (a large "
                                      f"keyspace); raise --max-scan-calls to look further", shards)
    found, shards = await _whole_queues(client, found, match)
    return ScanResult(sorted(found), True, None, shards)


def _one_slot(name: str) -> bool:
    """Whether every key of the queue ``name`` hashes to one cluster slot."""
    try:
        QueueKeys.for_name(name, cluster=True)
    except InvalidNameError:
        return False
    return True


async def _whole_queues(client: AnyRedis, names: set[str], match: str) -> tuple[set[str], dict[str, int]]:
    """``names`` with the shards of each sharded queue replaced by the queue's name (a name of one of
    the shards its record places, :func:`recorded_shards`: one ``HGET`` per name that may be a
    shard's), then those matching ``match``; and the shard count of each sharded queue among them."""
    bases = sorted({parts[0] for name in names if (parts := shard_name_parts(name)) is not None})
    records = dict(zip(bases, await asyncio.gather(*(recorded_shards(client, base) for base in bases)), strict=True))
    whole = set()
    for name in names:
        parts = shard_name_parts(name)
        sharded = parts is not None and records[parts[0]].index_of(parts[0], name) is not None
        whole.add(parts[0] if sharded and parts is not None else name)
    matching = {name for name in whole if fnmatch.fnmatchcase(name, match)}
    return matching, {name: records[name].count for name in matching if name in records and records[name].count > 1}


async def _scan_page(client: AnyRedis, node: Any, cursor: int, pattern: str) -> tuple[int, list[Any]]:
    """One ``SCAN cursor MATCH pattern COUNT 1000`` (on a Cluster, on ``node``): the next cursor and
    the keys."""
    if isinstance(client, RedisCluster):
        # A cluster's SCAN answers {node name: next cursor} (redis-py's typing says int).
        cursors, keys = await client.scan(cursor, match=pattern, count=1000, target_nodes=node)
        return int(next(iter(dict(cursors).values()), 0)), list(keys)  # type: ignore[call-overload]
    next_cursor, keys = await client.scan(cursor, match=pattern, count=1000)
    return int(next_cursor), list(keys)


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
