"""The minimal ACL of a queue's producers and consumers, in one place: the rules
``docs/deployments.md`` shows (a test compares them), the restricted user of the suite, and the
``aiodelayq doctor`` check that asks the server (``ACL DRYRUN``) whether a user may run each of them.

The pattern ``aiodelayq_*:{N}`` covers every aiodelayq key of the queue, the tier's bucket lists
(``aiodelayq_tier_<start>:{N}``) and the groups' lists (``aiodelayq_group_<group>:{N}``), named by the
scripts as they need them, included.
"""

from __future__ import annotations

from dataclasses import asdict

from .._wire.key_names import QueueKeys
from .._wire.placement import Placement, shard_names

__all__ = ["MINIMAL_COMMANDS", "WAITAOF_COMMANDS", "acl_literal", "acl_probes", "minimal_acl_rules"]

# Every command the library sends for a queue, the commands its scripts run included.
MINIMAL_COMMANDS = (
    "evalsha", "script|load", "time", "zadd", "zrange", "zrangebyscore", "zrem", "zscore", "zmscore", "zcard",
    "zcount", "zrank", "zremrangebyrank", "rpush", "lpush", "lpop", "rpop", "lrem", "llen", "lrange", "lindex",
    "lpos", "hget", "hset", "hdel", "hlen", "hmget", "hrandfield", "hincrby", "hexists", "hgetall", "hsetnx", "ltrim",
    "get", "incrby", "publish", "subscribe", "unsubscribe", "ping", "unlink", "wait", "type", "xadd", "xrange",
    "xrevrange", "xread",
)
# ... and on servers that have WAITAOF (Redis and Valkey >= 7.2; older ones refuse the name).
WAITAOF_COMMANDS = ("waitaof",)

# One call per command, as ACL DRYRUN takes it: the key (a QueueKeys attribute in braces) it is
# checked on and arguments of the right arity.
_PROBES: dict[str, tuple[str, ...]] = {
    "evalsha": ("EVALSHA", "0" * 40, "1", "{timeout_set}"),
    "script|load": ("SCRIPT", "LOAD", "return 1"),
    "time": ("TIME",),
    "zadd": ("ZADD", "{timeout_set}", "1", "m"),
    "zrange": ("ZRANGE", "{timeout_set}", "0", "0"),
    "zrangebyscore": ("ZRANGEBYSCORE", "{timeout_set}", "0", "1"),
    "zrem": ("ZREM", "{timeout_set}", "m"),
    "zscore": ("ZSCORE", "{timeout_set}", "m"),
    "zmscore": ("ZMSCORE", "{in_flight}", "m"),
    "zcard": ("ZCARD", "{timeout_set}"),
    "zcount": ("ZCOUNT", "{timeout_set}", "0", "1"),
    "zrank": ("ZRANK", "{timeout_set}", "m"),
    "zremrangebyrank": ("ZREMRANGEBYRANK", "{timeout_set}", "0", "0"),
    "rpush": ("RPUSH", "{destination}", "v"),
    "lpush": ("LPUSH", "{destination}", "v"),
    "lpop": ("LPOP", "{destination}"),
    "rpop": ("RPOP", "{tier_bucket}", "1"),
    "lrem": ("LREM", "{delay_list}", "0", "v"),
    "llen": ("LLEN", "{destination}"),
    "lrange": ("LRANGE", "{dead_letter}", "0", "1"),
    "lindex": ("LINDEX", "{tier_bucket}", "0"),
    "lpos": ("LPOS", "{tier_bucket}", "v"),
    "hget": ("HGET", "{controls}", "f"),
    "hset": ("HSET", "{key_index}", "f", "v"),
    "hdel": ("HDEL", "{key_index}", "f"),
    "hlen": ("HLEN", "{key_index}"),
    "hmget": ("HMGET", "{controls}", "f"),
    "hrandfield": ("HRANDFIELD", "{key_index}"),
    "hincrby": ("HINCRBY", "{groups}", "f", "1"),
    "hexists": ("HEXISTS", "{groups}", "f"),
    "hgetall": ("HGETALL", "{groups}"),
    "hsetnx": ("HSETNX", "{groups}", "f", "1"),
    "ltrim": ("LTRIM", "{dead_letter}", "0", "1"),
    "get": ("GET", "{tier_count}"),
    "incrby": ("INCRBY", "{tier_count}", "1"),
    "publish": ("PUBLISH", "{channel}", "1"),
    "subscribe": ("SUBSCRIBE", "{channel}"),
    "unsubscribe": ("UNSUBSCRIBE", "{channel}"),
    "ping": ("PING",),
    "unlink": ("UNLINK", "{timeout_set}"),
    "wait": ("WAIT", "0", "0"),
    "type": ("TYPE", "{destination}"),
    "xadd": ("XADD", "{event_stream}", "*", "k", "v"),
    "xrange": ("XRANGE", "{event_stream}", "-", "+"),
    "xrevrange": ("XREVRANGE", "{event_stream}", "+", "-"),
    "xread": ("XREAD", "STREAMS", "{event_stream}", "0"),
    "waitaof": ("WAITAOF", "0", "0", "0"),
}


def minimal_acl_rules(name: str, *, waitaof: bool = False, shards: int = 1,
                      placement: Placement = "spaced") -> list[str]:
    """The ``ACL SETUSER`` rules (after the user name, ``on`` and the password) of a user that may
    produce and consume the queue ``name``: its keys, its channel, and :data:`MINIMAL_COMMANDS`
    (with :data:`WAITAOF_COMMANDS` when ``waitaof``). A sharded queue also needs its name's keys
    (they hold the shard count; no channel: nothing is published there), then each shard's."""
    commands = MINIMAL_COMMANDS + (WAITAOF_COMMANDS if waitaof else ())
    if shards == 1:
        patterns = _queue_patterns(name, channel=True)
    else:
        patterns = _queue_patterns(name, channel=False)
        for shard in shard_names(name, shards, placement):
            patterns += _queue_patterns(shard, channel=True)
    keys = [rule for rule in patterns if rule.startswith("~")]
    channels = [rule for rule in patterns if rule.startswith("&")]
    return ["resetkeys", "resetchannels", "-@all", *keys, *channels, *(f"+{command}" for command in commands)]


def _queue_patterns(name: str, *, channel: bool) -> list[str]:
    """The key patterns (``~``) of the queue ``name``, its channel's among them (the scripts that
    publish declare it as a key), and with ``channel`` the channel permission (``&``)."""
    keys = QueueKeys.for_name(name)
    tag = acl_literal(keys.timeout_set.partition(":")[2])  # "{name}", or the name's own hash tag form
    listed = (keys.destination, keys.timeout_set, keys.delay_list, keys.channel)
    return [*(f"~{acl_literal(key)}" for key in listed), f"~aiodelayq_*:{tag}",
            *((f"&{acl_literal(keys.channel)}",) if channel else ())]


def acl_literal(text: str) -> str:
    """``text`` as an ACL glob that matches only itself (``*``, ``?``, ``[``, ``]``, ``\\`` escaped)."""
    return "".join("\\" + char if char in "*?[]\\" else char for char in text)


def acl_probes(keys: QueueKeys, *, waitaof: bool = False) -> list[tuple[str, tuple[str, ...]]]:
    """``(what, call)`` pairs for ``ACL DRYRUN user *call``: one per command of the minimal ACL, then
    one ``EVALSHA`` declaring each key of the queue (a tier bucket among them)."""
    fields: dict[str, str] = {**asdict(keys), "tier_bucket": keys.tier_bucket(0), "group_list": keys.group_list("g")}
    commands = MINIMAL_COMMANDS + (WAITAOF_COMMANDS if waitaof else ())
    probes = [(command, tuple(arg.format(**fields) for arg in _PROBES[command])) for command in commands]
    probes += [(f"key {key}", ("EVALSHA", "0" * 40, "1", key)) for attr, key in sorted(fields.items())
               if attr != "channel"]
    return probes
