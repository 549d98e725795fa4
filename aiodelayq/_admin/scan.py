"""Queues found by ``SCAN`` (:func:`scan_queues`): the keys whose names reveal a queue, read back to the
queue's name, a sharded queue's shards counted as the queue."""

from __future__ import annotations

import asyncio
import fnmatch
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from redis.asyncio.cluster import RedisCluster

from .._redis.connections import AnyRedis
from .._wire.key_names import QueueKeys, prefix_name
from .._wire.placement import shard_name_parts
from ..exceptions import InvalidNameError
from .reads import recorded_shards

__all__ = ["QUEUE_KEY_PREFIXES", "ScanResult", "queue_name_of", "scan_queues"]

# The tier index because all pending items may be tiered, the grouped zset and the groups' hash because
# all may be grouped; the two lists because a queue keeps them when nothing is pending. The destination
# list has the bare name: it cannot be told from any other list.
QUEUE_KEY_PREFIXES = ("redisson_delay_queue_timeout", "aiodelayq_tier_index", "aiodelayq_grouped", "aiodelayq_groups",
                      "aiodelayq_dead_letter", "aiodelayq_in_flight")


@dataclass(frozen=True)
class ScanResult:
    """Queue names found by :func:`scan_queues`.

    Attributes:
        names: sorted queue names.
        complete: ``False`` when the scan stopped before the end of the keyspace.
        note: why it stopped early (``None`` when complete).
        shards: the recorded shard count of each sharded queue among ``names`` (the others are
            ordinary queues').
    """

    names: list[str]
    complete: bool
    note: str | None
    shards: dict[str, int] = field(default_factory=dict)


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

