"""A one-time check per client: does the server's eviction policy put pending items at risk?

A queue's keys carry no TTL, so only ``allkeys-*`` policies can silently drop them. The check runs
in the background (never delaying an offer or an open); a user without ``INFO`` skips it quietly.
"""

from __future__ import annotations

import asyncio
import logging

from .._util.tasks import keep
from ..exceptions import BackendError
from .client_facts import facts_for
from .connections import AnyRedis
from .retry import call_idempotent

__all__ = ["SAFE_POLICIES", "check_eviction_policy", "parse_policy"]

log = logging.getLogger("aiodelayq")

SAFE_POLICIES = frozenset({"noeviction", "volatile-lru", "volatile-lfu", "volatile-random", "volatile-ttl"})


def check_eviction_policy(client: AnyRedis) -> None:
    """Start the check for ``client`` unless it ran already (returns at once)."""
    facts = facts_for(client)
    if facts.eviction_checked:
        return
    facts.eviction_checked = True
    keep(asyncio.get_running_loop().create_task(_check(client), name="aiodelayq-eviction-check"))


async def _check(client: AnyRedis) -> None:
    try:
        info: bytes = await call_idempotent(client, "INFO", "memory", what="INFO memory", timeout_s=5.0)
    except BackendError as exc:
        log.debug("could not read the eviction policy (%s)", exc)
        return
    policy = parse_policy(info)
    if policy is not None and policy not in SAFE_POLICIES:
        log.warning("the Redis server's maxmemory-policy is %r: when maxmemory is reached it may "
                    "evict a queue's keys and silently lose pending items; use noeviction (or a volatile-* "
                    "policy: queue keys have no TTL)", policy)


def parse_policy(info: bytes | str) -> str | None:
    """The ``maxmemory_policy`` field of an ``INFO memory`` reply, if present."""
    text = info.decode(errors="replace") if isinstance(info, bytes) else info
    for line in text.splitlines():
        if line.startswith("maxmemory_policy:"):
            return line.split(":", 1)[1].strip()
    return None
