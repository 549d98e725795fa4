"""How every Redis command of the library travels: one pooled connection, no hidden resend, a bound.

redis-py's defaults break delivery guarantees in three ways, so library calls bypass
``Redis.execute_command`` and ``Script.__call__``:

- **Resends.** redis-py resends a command whose reply was lost (a resent pop loses items, a resent
  offer delivers twice). Here nothing is resent behind the caller's back; callers resend only calls
  with a call id the scripts deduplicate, or idempotent ones.
- **Half-read connections.** On timeout redis-py keeps the connection, so the late reply answers the
  next command (redis/redis-py#2624). Here a call that times out, fails or is cancelled drops it.
- **Connections closed while idle** are handed out by redis-py 8.1's pool (redis/redis-py#4252):
  each exchange reconnects a closed or dirty one before sending (nothing sent, nothing in doubt).
- **Swallowed cancellations** (redis/redis-py#2028, #2551): the exchange runs in a child task that
  the caller awaits with ``asyncio.wait``, which never swallows the caller's cancellation.
"""

from __future__ import annotations

import asyncio
import hashlib
import ssl
from collections.abc import Callable, Sequence
from functools import cached_property
from typing import Any, TypeAlias

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import (
    AskError,
    AuthenticationError,
    AuthorizationError,
    NoPermissionError,
    NoScriptError,
    ResponseError,
)

from .._util.tasks import keep
from .._wire.key_names import QueueKeys
from ..exceptions import AccessDeniedError, BackendError, CallTimeoutError, ShardCountError, WrongNodeError
from .acl import acl_literal
from .cluster import cluster_exchange, mark_stale
from .exchange import exchange, reconnect_if_closed, result

__all__ = ["AnyRedis", "Script", "call", "call_pipelined", "channel_denied", "classify", "is_permanent",
           "run_script"]

AnyRedis: TypeAlias = Redis | RedisCluster
"""The clients the library takes: a single server (or Sentinel-managed primary) or a cluster."""

class Script:
    """A Lua script: its text and SHA1, shared by every client of the process (nothing is kept per
    client, so a client can be garbage collected with its queue)."""

    def __init__(self, name: str, text: str | Callable[[], str]) -> None:
        self.name = name
        self._text = text

    @cached_property
    def text(self) -> str:
        """The Lua source; ``text`` given as a function is called on first use (once)."""
        return self._text if isinstance(self._text, str) else self._text()

    @cached_property
    def sha(self) -> str:
        """The SHA1 of :attr:`text`, as ``EVALSHA`` takes it."""
        return hashlib.sha1(self.text.encode()).hexdigest()

    def __repr__(self) -> str:
        return f"<Script {self.name} {self.sha[:8]}>"


def is_permanent(exc: BaseException) -> bool:
    """Whether retrying cannot help: missing permission, a key on another cluster node, or an ordinary
    queue object on a sharded queue's name."""
    return isinstance(exc, (AccessDeniedError, WrongNodeError, ShardCountError))


def classify(what: str, exc: BaseException, *, sent: bool, channels: Sequence[str] = ()) -> BackendError:
    """Turn a redis-py or OS error into the library's error for ``what``; ``sent``: the command may
    have reached the server (``maybe_applied`` on a connection failure or timeout); ``channels``: the
    pub/sub channels it used, named on a refusal (the server's text does not)."""
    if isinstance(exc, BackendError):
        return exc
    text = str(exc)
    if isinstance(exc, (NoPermissionError, AuthenticationError, AuthorizationError)) or _denied(text):
        if channels and _about_channel(text):
            return channel_denied(what, channels, text)
        return AccessDeniedError(f"{what}: permission denied: {text}")
    if isinstance(exc, AskError) or text.startswith(("MOVED", "ASK ")):
        return WrongNodeError(f"{what}: the key lives on another cluster node ({text}); a plain "
                              "redis.asyncio.Redis cannot follow it: use a redis.asyncio.RedisCluster")
    if isinstance(exc, ResponseError):
        # The server answered with an error: the call did not complete (a script that failed
        # midway may have applied its first writes; the scripts order their writes for that).
        return BackendError(f"{what} failed: {text}", maybe_applied=False)
    if (refused := _tls_refusal(exc)) is not None:
        # A certificate refused on either side: permanent, like a wrong password (nothing was sent).
        return AccessDeniedError(f"{what}: TLS handshake failed: {refused}")
    # A dropped connection, a timeout, or a non-Redis error raised while redis-py tears a
    # connection down under the call: the outcome is unknown if the command was sent.
    detail = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    return BackendError(f"{what} failed: {detail}", maybe_applied=sent)


def _tls_refusal(exc: BaseException) -> ssl.SSLError | None:
    """The ``ssl`` error among ``exc``'s causes that refused a certificate (either side's), if any."""
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if isinstance(cause, ssl.SSLCertVerificationError) or (
                isinstance(cause, ssl.SSLError) and any(word in str(cause.reason or cause).upper()
                                                        for word in ("CERTIFICATE", "UNKNOWN_CA"))):
            return cause
        cause = cause.__cause__ or cause.__context__
    return None


def _sharded_name(what: str, text: str) -> ShardCountError:
    """The refusal of an ordinary queue's OFFER or TRANSFER on a name that records a shard count."""
    count = text.split()[1]
    return ShardCountError.refusing(what, recorded=int(count) if count.isdigit() else 0, wanted=1)


def channel_denied(what: str, channels: Sequence[str], text: str) -> AccessDeniedError:
    """The error of a refused pub/sub channel permission (``text``: the server's words), naming
    ``channels`` and the ACL rule that grants each (as ``_redis/acl.py``)."""
    rules = " ".join(f"&{acl_literal(channel)}" for channel in channels)
    how = f"(ACL SETUSER <user> {rules}; the Deployments page of the docs shows the minimal ACL)"
    if len(channels) == 1:
        return AccessDeniedError(f"{what}: permission denied for pub/sub channel {channels[0]!r} ({text}): the "
                                 f"Redis user needs the ACL rule {rules} {how}")
    return AccessDeniedError(f"{what}: permission denied for one of the pub/sub channels "
                             f"{', '.join(map(repr, channels))} ({text}): the Redis user needs the ACL rule of "
                             f"each {how}")


# How servers word a permission refusal, also from inside a script (Redis 6.2/7, Valkey 8).
_DENIED = ("NOPERM", "NOAUTH", "WRONGPASS", "ACL failure", "can't run this command", "no permissions",
           "No permissions", "can't access", "can't publish")


def _denied(text: str) -> bool:
    return text.startswith(_DENIED[:3]) or any(marker in text for marker in _DENIED[3:])


def _about_channel(text: str) -> bool:
    """Whether a refusal concerns a pub/sub channel rather than a command, a key or the login."""
    return "channel" in text.lower()


# The channel of every queue starts with this (Redisson's channel prefix), whatever its name.
_CHANNEL_PREFIX = QueueKeys.for_name("_").channel.partition(":")[0] + ":"


def _text(key: Any) -> str:
    return key.decode(errors="replace") if isinstance(key, bytes) else str(key)


async def _exchange(client: AnyRedis, commands: Sequence[Sequence[Any]], sent: list[bool], route: Any,
                    then: Sequence[Any] | None, node: Any) -> list[Any]:
    if isinstance(client, RedisCluster):
        assert len(commands) == 1, "a cluster exchange carries one command"
        return [await cluster_exchange(client, commands[0], route, sent, then, node=node)]
    pool: Any = client.connection_pool
    conn = await pool.get_connection()
    try:
        await reconnect_if_closed(conn)
        replies = await exchange(conn, commands, sent, then)
    finally:
        await pool.release(conn)
    return [result(replies, then)] if len(commands) == 1 else replies


async def _bounded(client: AnyRedis, commands: Sequence[Sequence[Any]], *, what: str, timeout_s: float,
                   route: Any = None, then: Sequence[Any] | None = None, node: Any = None) -> list[Any]:
    sent = [False]
    # Kept referenced until it ends: a cancelled child needs a few loop turns to close its
    # connection, and an abandoned one may end with the error of a connection dropped under it.
    child = keep(asyncio.get_running_loop().create_task(_exchange(client, commands, sent, route, then, node)),
                 quiet=True)
    try:
        done, _ = await asyncio.wait({child}, timeout=timeout_s)
    except asyncio.CancelledError:
        child.cancel()  # drops its connection: never returned to the pool half-read
        raise
    if not done:
        child.cancel()
        if isinstance(client, RedisCluster):
            mark_stale(client)  # the node may be gone (a failover): read the slot map again
        outcome = "it may have been applied" if sent[0] else "it was not sent (no connection was made)"
        raise CallTimeoutError(f"{what}: no reply within {timeout_s:g} s; {outcome}", maybe_applied=sent[0])
    try:
        return child.result()
    except ResponseError as exc:
        if str(exc).startswith("SHARDED "):  # OFFER or TRANSFER of an ordinary queue on a sharded name
            raise _sharded_name(what, str(exc)) from exc
        raise classify(what, exc, sent=sent[0]) from exc
    except Exception as exc:
        raise classify(what, exc, sent=sent[0]) from exc


async def call(client: AnyRedis, *args: Any, what: str, timeout_s: float, route: Any = None,
               then: Sequence[Any] | None = None, node: Any = None) -> Any:
    """Send one command and return its reply, within ``timeout_s`` seconds. Never resent (on a
    cluster, only where the cluster said it did not run it: see ``_redis/cluster.py``).

    ``route``: a key the command touches (a cluster sends it to that key's primary; ``None``: any
    node); ``node``: a cluster node to send it to as it is (``SCRIPT LOAD`` where ``NOSCRIPT`` came
    from). ``then``: a command on the same connection after it succeeded (``WAIT``); the reply is
    then ``(reply, reply to then)``, the second possibly a ``ResponseError`` (the first ran).

    Raises:
        CallTimeoutError: no reply within ``timeout_s`` (``maybe_applied``: the command was sent).
        AccessDeniedError, WrongNodeError: permanent errors.
        BackendError: any other failure; ``maybe_applied`` tells whether it may have been applied.
        asyncio.CancelledError: the caller's cancellation (the command may have been applied).
    """
    [reply] = await _bounded(client, [args], what=what, timeout_s=timeout_s, route=route, then=then, node=node)
    return reply


async def call_pipelined(client: Redis, commands: Sequence[Sequence[Any]], *, what: str,
                         timeout_s: float) -> list[Any]:
    """Send ``commands`` to a single server (not a cluster) in one write and return their replies in
    order, an error reply as its ``ResponseError`` (returned), within ``timeout_s`` seconds. Never resent.

    Raises: as :func:`call`.
    """
    return await _bounded(client, commands, what=what, timeout_s=timeout_s)


async def run_script(client: AnyRedis, script: Script, keys: Sequence[Any], args: Sequence[Any], *,
                     timeout_s: float, what: str | None = None, then: Sequence[Any] | None = None) -> Any:
    """``EVALSHA`` ``script`` (loading it on ``NOSCRIPT``) within ``timeout_s`` seconds in all; on a
    cluster, on the primary of ``keys[0]``'s slot (a queue's keys share one). ``then``: as in :func:`call`.

    Raises: as :func:`call`. A ``PUBLISH`` the script's user may not send is an
        :class:`AccessDeniedError` naming the queue's channel among ``keys``; ``maybe_applied``, as
        the script's writes before it stay applied.
    """
    label = what or script.name
    try:
        return await _evalsha(client, script, keys, args, timeout_s=timeout_s, label=label, then=then)
    except AccessDeniedError as exc:
        cause = exc.__cause__
        channels = [key for key in map(_text, keys) if key.startswith(_CHANNEL_PREFIX)]
        if cause is None or not channels or not _about_channel(str(cause)):
            raise
        denied = channel_denied(label, channels, str(cause))
        denied.maybe_applied = True
        raise denied from cause


async def _evalsha(client: AnyRedis, script: Script, keys: Sequence[Any], args: Sequence[Any], *,
                   timeout_s: float, label: str, then: Sequence[Any] | None) -> Any:
    route = keys[0] if keys else None
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    command = ("EVALSHA", script.sha, len(keys), *keys, *args)
    try:
        return await call(client, *command, what=label, timeout_s=timeout_s, route=route, then=then)
    except BackendError as exc:
        if not isinstance(exc.__cause__, NoScriptError):
            raise
        # On a cluster, the node that said NOSCRIPT (an ASK target is not the slot's owner yet).
        node = getattr(exc.__cause__, "node", None)
    await call(client, "SCRIPT", "LOAD", script.text, what=f"{label} (SCRIPT LOAD)",
               timeout_s=max(0.001, deadline - loop.time()), route=route, node=node)
    return await call(client, *command, what=label, timeout_s=max(0.001, deadline - loop.time()), route=route,
                      then=then)
