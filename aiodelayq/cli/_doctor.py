"""``aiodelayq doctor``: what a deployment puts at risk, one finding per check, without typer or rich.

Every call here only reads. A call the user may not make (a restricted ACL) turns its check into a
warning that says so; it never fails the run.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from redis.asyncio import RedisCluster
from redis.asyncio.sentinel import SentinelConnectionPool
from redis.exceptions import ResponseError

from .._admin.reads import recorded_shards
from .._queue import DelayedQueue
from .._redis.acl import acl_probes
from .._redis.connections import AnyRedis
from .._redis.eviction import SAFE_POLICIES
from .._scripts import QueueScripts
from .._scripts.foreign_keys import foreign_keys, is_wrong_type
from .._wire.elements import classify_element, long_format
from .._wire.key_names import QueueKeys
from ..exceptions import BackendError

__all__ = ["MIN_VERSION", "Finding", "diagnose"]

Status = Literal["ok", "warn", "fail"]

# The oldest server the library runs on (ZMSCORE, LPOP with a count, ZRANGE ... BYSCORE).
MIN_VERSION = (6, 2)
# Pending elements looked at per queue for the format check.
_SAMPLE = 100
# Bound of each read here, seconds.
_CALL_TIMEOUT_S = 5.0

Call = Callable[..., Awaitable[Any]]


@dataclass(frozen=True)
class Finding:
    """One check's result.

    Attributes:
        check: its name (``eviction``, ``persistence``, ``replication``, ``server``, ``acl``,
            ``keys``, ``format``, ``lag``, ``clock``).
        status: ``ok``, ``warn`` (does not fail the run) or ``fail``.
        where: the server (``host:port``) or the queue it is about.
        saw: what it saw, one sentence.
        todo: what to do about it (``None`` when there is nothing to do).
    """

    check: str
    status: Status
    where: str
    saw: str
    todo: str | None = None


async def diagnose(client: AnyRedis, names: Sequence[str], *, max_lag_s: float = 60.0, max_skew_s: float = 1.0,
                   wire_format: str = "redisson", acl_user: str | None = None) -> list[Finding]:
    """Every check, on every primary (server checks) and every queue of ``names`` (each shard of a
    sharded queue).

    ``max_lag_s``: a queue whose due items wait longer fails. ``max_skew_s``: a clock further off
    warns. ``wire_format``: what the queue's producers write. ``acl_user``: whose ACL to check (the
    client's own user by default; checking needs ``ACL DRYRUN``, Redis and Valkey >= 7.0, and the
    permission to run it).

    Raises:
        redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError: the server went away.
    """
    findings: list[Finding] = []
    servers = await _servers(client)
    for where, call in servers:
        findings += await _server_checks(where, call, max_skew_s)
    user = acl_user or await _whoami(servers[0][1])
    for name in names:
        for queue_name in (await recorded_shards(client, name)).names(name):
            findings += await _queue_checks(client, queue_name, user, max_lag_s=max_lag_s, wire_format=wire_format)
    return findings


async def _servers(client: AnyRedis) -> list[tuple[str, Call]]:
    """``(host:port, call)`` of the server, or of each primary of a Cluster."""
    if isinstance(client, RedisCluster):
        return [(node.name, _node_call(client, node)) for node in client.get_primaries()]
    pool = client.connection_pool
    if isinstance(pool, SentinelConnectionPool):  # the primary the Sentinels name now
        host, port = await pool.get_master_address()  # type: ignore[no-untyped-call]
        return [(f"{host}:{port}", client.execute_command)]
    kwargs = pool.connection_kwargs
    where = kwargs.get("path") or f"{kwargs.get('host', 'localhost')}:{kwargs.get('port', 6379)}"
    return [(str(where), client.execute_command)]


def _node_call(client: RedisCluster, node: Any) -> Call:
    """Calls sent to one node of a Cluster (commands without a key, such as ``ACL``, need one)."""

    async def call(*args: Any) -> Any:
        reply = await client.execute_command(*args, target_nodes=node)
        return reply[node.name] if isinstance(reply, dict) and node.name in reply else reply

    return call


def _call_for(client: AnyRedis, key: str) -> Call:
    """Calls sent to the server that holds ``key`` (on a Cluster, the primary of its slot)."""
    if isinstance(client, RedisCluster):
        return _node_call(client, client.get_node_from_key(key))
    return client.execute_command


async def _read(call: Call, *args: Any) -> Any:
    """One bounded read; a refusal (ACL, unknown command) comes back as the ``ResponseError``."""
    try:
        return await asyncio.wait_for(call(*args), _CALL_TIMEOUT_S)
    except ResponseError as exc:
        return exc


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _config(reply: Any, name: str) -> str | None:
    """One parameter of a ``CONFIG GET`` reply (redis-py's dict); ``None`` when refused or absent."""
    if isinstance(reply, dict):
        for key, value in reply.items():
            if _text(key) == name:
                return _text(value)
    return None


async def _server_checks(where: str, call: Call, max_skew_s: float) -> list[Finding]:
    info = await _read(call, "INFO", "all")
    if isinstance(info, ResponseError):
        return [Finding("server", "warn", where, f"INFO is refused ({info})",
                        "run doctor as a user that may run INFO and CONFIG GET to check the server")]
    out = [_version(where, info), _eviction(where, info), await _persistence(where, call, info),
           await _replication(where, call, info), await _commands(where, call)]
    out.append(await _clock(where, call, max_skew_s))
    return out


def _version(where: str, info: dict[str, Any]) -> Finding:
    name = "valkey" if "valkey_version" in info else "redis"
    text = _text(info.get("valkey_version", info.get("redis_version", "0")))
    version = tuple(int(part) for part in text.split(".")[:2] if part.isdigit())
    if version < MIN_VERSION:
        return Finding("server", "fail", where, f"{name} {text} is older than 6.2",
                       "upgrade to Redis or Valkey 6.2 or later")
    return Finding("server", "ok", where, f"{name} {text}")


def _eviction(where: str, info: dict[str, Any]) -> Finding:
    policy = _text(info.get("maxmemory_policy", "?"))
    limit = int(info.get("maxmemory", 0) or 0)
    at = f"maxmemory {limit} B" if limit else "maxmemory 0 (no limit)"
    if policy in SAFE_POLICIES:
        return Finding("eviction", "ok", where, f"maxmemory-policy {policy}, {at}: pending items are never evicted")
    if policy.startswith("allkeys-"):
        return Finding("eviction", "fail", where, f"maxmemory-policy {policy}, {at}: once maxmemory is reached Redis "
                       "may evict a queue's keys and lose pending items",
                       "CONFIG SET maxmemory-policy noeviction (or a volatile-* policy)")
    return Finding("eviction", "warn", where, f"maxmemory-policy {policy!r} is unknown here",
                   "use noeviction")


async def _persistence(where: str, call: Call, info: dict[str, Any]) -> Finding:
    aof = str(info.get("aof_enabled", "0")) == "1"
    save = _config(await _read(call, "CONFIG", "GET", "save"), "save")
    if aof:
        fsync = _config(await _read(call, "CONFIG", "GET", "appendfsync"), "appendfsync") or "?"
        return Finding("persistence", "ok", where, f"AOF on (appendfsync {fsync})")
    if save is None:
        return Finding("persistence", "warn", where, "AOF off; RDB snapshots unknown (CONFIG GET refused)",
                       "a restart without persistence loses every pending item: appendonly yes")
    if save.strip():
        return Finding("persistence", "warn", where, f"AOF off, RDB snapshots ({save}): a crash loses the writes "
                       "since the last snapshot", "appendonly yes (appendfsync everysec)")
    return Finding("persistence", "warn", where, "persistence off (no AOF, no RDB snapshots): a restart loses "
                   "every pending item", "appendonly yes")


async def _replication(where: str, call: Call, info: dict[str, Any]) -> Finding:
    role = _text(info.get("role", "?"))
    if role in ("slave", "replica"):
        return Finding("replication", "fail", where, "this server is a replica: writes are refused",
                       "point --redis-url at the primary (or use Sentinel or Cluster)")
    replicas = int(info.get("connected_slaves", 0) or 0)
    wanted = _config(await _read(call, "CONFIG", "GET", "min-replicas-to-write"), "min-replicas-to-write")
    floor = "min-replicas-to-write unknown" if wanted is None else f"min-replicas-to-write {wanted}"
    if replicas == 0:
        return Finding("replication", "warn", where, f"no replica ({floor}): a lost server loses the queue",
                       "add a replica; for writes no failover can lose, min_replicas=1 on the queue")
    return Finding("replication", "ok", where, f"{replicas} replica(s) connected, {floor}")


async def _commands(where: str, call: Call) -> Finding:
    missing = []
    for command in ("evalsha", "zmscore", "hrandfield", "lpop", "publish", "time", "unlink"):
        try:
            reply = await _read(call, "COMMAND", "INFO", command)
        except TypeError:  # redis-py's parser of COMMAND INFO fails on the null entry of an unknown command
            reply = None
        if isinstance(reply, ResponseError):
            return Finding("commands", "warn", where, f"COMMAND INFO is refused ({reply})", None)
        if not reply:
            missing.append(command)
    if missing:
        return Finding("commands", "fail", where, f"the server lacks {', '.join(missing)} (renamed or disabled)",
                       "enable the commands the library needs (rename-command)")
    return Finding("commands", "ok", where, "every command the library needs exists")


async def _clock(where: str, call: Call, max_skew_s: float) -> Finding:
    sent = time.time()
    reply = await _read(call, "TIME")
    received = time.time()
    if isinstance(reply, ResponseError):
        return Finding("clock", "warn", where, f"TIME is refused ({reply})", "grant +time: the scripts need it")
    seconds, micros = reply
    skew_s = (int(seconds) + int(micros) / 1e6) - (sent + received) / 2
    saw = f"this machine's clock is {abs(skew_s):.3f} s {'behind' if skew_s > 0 else 'ahead of'} the server's"
    if abs(skew_s) > max_skew_s:
        return Finding("clock", "warn", where, saw + " (due times use the server's clock; delivery is unaffected)",
                       "sync this machine's clock (NTP): its logs and the times it shows are off")
    return Finding("clock", "ok", where, saw)


async def _whoami(call: Call) -> str | None:
    reply = await _read(call, "ACL", "WHOAMI")
    return None if isinstance(reply, ResponseError) else _text(reply)


async def _queue_checks(client: AnyRedis, name: str, user: str | None, *, max_lag_s: float,
                        wire_format: str) -> list[Finding]:
    keys = QueueKeys.for_name(name)
    queue: DelayedQueue[Any] = DelayedQueue(client, name, codec="bytes", call_timeout_s=_CALL_TIMEOUT_S)
    try:
        out = [await _acl(client, keys, user), await _key_types(client, keys)]
        try:
            counts = await queue.counts()
        except BackendError as exc:  # an ACL refusal or a key of another type: the finding
            todo = ("another program writes a key of the queue: see the keys check" if is_wrong_type(exc) else
                    "grant the minimal ACL")
            return [*out, Finding("lag", "fail", name, f"counts() failed: {exc}", todo)]
        out.append(_lag(name, counts.lag_ms, counts.pending, counts.ready, max_lag_s))
        out.append(await _format(client, keys, wire_format))
        return out
    finally:
        await queue.aclose()


async def _acl(client: AnyRedis, keys: QueueKeys, user: str | None) -> Finding:
    name = keys.destination
    if user is None:
        return Finding("acl", "warn", name, "ACL WHOAMI is refused: the user is not known",
                       "grant +acl|whoami, or check the rules of docs/deployments.md by hand")
    denied: list[str] = []
    call = _call_for(client, keys.timeout_set)
    for what, probe in acl_probes(keys):
        reply = await _read(call, "ACL", "DRYRUN", user, *probe)
        if isinstance(reply, ResponseError):
            return Finding("acl", "warn", name, f"user {user!r}: ACL DRYRUN is refused or unknown ({reply})",
                           "run doctor as an admin user (Redis/Valkey >= 7.0) to check this user's ACL")
        if _text(reply) != "OK":
            denied.append(what)
    if denied:
        return Finding("acl", "fail", name, f"user {user!r} may not run: {', '.join(denied)}",
                       "add the minimal ACL of docs/deployments.md for this queue")
    return Finding("acl", "ok", name, f"user {user!r} has every permission of the minimal ACL")


async def _key_types(client: AnyRedis, keys: QueueKeys) -> Finding:
    """The queue's keys that hold another type than the queue keeps there (another program's)."""
    name = keys.destination
    try:
        foreign = await foreign_keys(QueueScripts(client, keys, call_timeout_s=_CALL_TIMEOUT_S))
    except BackendError as exc:
        return Finding("keys", "warn", name, f"the types of the queue's keys could not be read ({exc})",
                       "grant +type (the minimal ACL has it)")
    if foreign:
        return Finding("keys", "fail", name, "; ".join(k.saw for k in foreign), "; ".join(k.todo for k in foreign))
    return Finding("keys", "ok", name, "every key of the queue holds the type the queue keeps there")


def _lag(name: str, lag_ms: int, pending: int, ready: int, max_lag_s: float) -> Finding:
    if lag_ms > max_lag_s * 1000:
        return Finding("lag", "fail", name, f"due items wait {lag_ms / 1000:.1f} s and no transfer moves them "
                       f"({pending} pending, {ready} ready)",
                       "open a consumer of the queue (or a worker); check its log for transfer errors")
    return Finding("lag", "ok", name, f"lag {lag_ms} ms ({pending} pending, {ready} ready)")


async def _format(client: AnyRedis, keys: QueueKeys, wire_format: str) -> Finding:
    name = keys.destination
    elements = await _read(client.execute_command, "ZRANGE", keys.timeout_set, 0, _SAMPLE - 1)
    if isinstance(elements, ResponseError) or not elements:
        return Finding("format", "ok", name, "no pending element to look at")
    try:
        native = await QueueScripts(client, keys, call_timeout_s=_CALL_TIMEOUT_S).native_long(what="NATIVE_LONG")
    except BackendError:
        native = b"\x01" + bytes(7)  # a 64-bit little-endian server, the usual one
    fmt = long_format(native)
    kinds: dict[str, int] = {}
    for element in elements:
        kind = classify_element(element, fmt)
        kinds[kind] = kinds.get(kind, 0) + 1
    seen = ", ".join(f"{count} {kind}" for kind, count in sorted(kinds.items()))
    sample = f"{len(elements)} of the earliest pending elements: {seen}"
    if kinds.get("malformed"):
        return Finding("format", "warn", name, sample, "malformed elements go to the dead-letter list when due: "
                       "find the producer that wrote them")
    legacy = kinds.get("legacy", 0)
    if legacy and legacy < len(elements):
        return Finding("format", "warn", name, sample + ": legacy (Redisson < 3.21.1) and newer elements mixed",
                       "a Java transfer reads only its own format and stalls at the other's: give every producer "
                       "the wire_format of every Java process (docs: Java interop)")
    if bool(legacy) != (wire_format == "redisson-legacy"):
        return Finding("format", "warn", name, sample + f", not what --wire-format {wire_format} writes",
                       "match wire_format to the Redisson version of every Java process: 'redisson-legacy' for "
                       "< 3.21.1, else 'redisson'")
    return Finding("format", "ok", name, sample)
