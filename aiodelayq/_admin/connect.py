"""Where a command or a dashboard connects (:class:`Target`), the client it gets (:func:`connect`), and
the two failures an operator reads as one line (:class:`CannotConnect`, :class:`BadInput`)."""

from __future__ import annotations

import contextlib
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.connection import SSLConnection, parse_url
from redis.asyncio.sentinel import MasterNotFoundError, Sentinel
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisClusterException, RedisError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .._redis.connections import AnyRedis
from .._util.urls import redact

__all__ = ["CONNECT_TIMEOUT_S", "SOCKET_TIMEOUT_S", "BadInput", "CannotConnect", "Target", "connect"]

# Bounds of the calls made here and in .reads and .scan (PING, TIME, SCAN); the queue's calls have
# call_timeout_s. A URL's own socket_timeout/socket_connect_timeout win over these.
CONNECT_TIMEOUT_S = 5.0
SOCKET_TIMEOUT_S = 10.0


class CannotConnect(Exception):
    """The server at ``url`` (password masked) could not be reached; ``reason`` says why."""

    def __init__(self, url: str, reason: str) -> None:
        super().__init__(f"cannot connect to {url}: {reason}")
        self.url = url
        self.reason = reason


class BadInput(Exception):
    """A command-line argument the command cannot use (a usage error, exit code 2)."""


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
    call_timeout_s."""
    try:
        await client.ping()
    except (RedisConnectionError, RedisTimeoutError, ResponseError, OSError) as exc:
        # AuthenticationError is a ConnectionError. ResponseError: the connection's set-up refused
        # (SELECT of a database a Cluster lacks).
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

