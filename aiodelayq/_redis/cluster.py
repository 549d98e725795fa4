"""Redis Cluster: which node a call goes to, and the cluster's answers it follows.

The library sends its own commands (``_redis/connections.py``), so it follows the cluster itself:

- ``MOVED``, ``ASK`` (``ASKING`` and the command on one connection), ``TRYAGAIN``, ``CLUSTERDOWN``
  (after a pause): nothing ran, so the command goes again.
- A connection error or a timeout: the outcome is unknown, so nothing is resent here (the caller
  decides), and the slot map is read again before the next call (a failover).

Bounded by ``_MAX_ATTEMPTS`` and the caller's deadline, which covers the whole exchange.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import Sequence
from typing import Any

from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.cluster import PRIMARY
from redis.exceptions import (
    AskError,
    ClusterDownError,
    MovedError,
    NoScriptError,
    ResponseError,
    SlotNotCoveredError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .exchange import exchange, reconnect_if_closed, result

__all__ = ["cluster_exchange", "is_cluster", "mark_stale"]

log = logging.getLogger("aiodelayq")

# Redirections and pauses one call may take: a migration answers ASK/TRYAGAIN until its last key
# moved, a failover CLUSTERDOWN until the replica took over (about 2x cluster-node-timeout).
_MAX_ATTEMPTS = 64
# Pause before sending again after TRYAGAIN or CLUSTERDOWN: 10 ms doubling up to 200 ms.
_PAUSE_S = (0.01, 0.2)

# The logged name of an answer that is sent again after a pause (ClusterDownError's subclasses,
# such as MasterDownError, count as CLUSTERDOWN).
_PAUSED = {TryAgainError: "TRYAGAIN", ClusterDownError: "CLUSTERDOWN", SlotNotCoveredError: "uncovered"}


def _redirected(answer: str, slot: int | None) -> None:
    """A call met ``answer`` (``MOVED``, ``ASK``, ``TRYAGAIN``, ``CLUSTERDOWN``, ``uncovered``) and goes again."""
    log.debug("cluster answered %s for slot %s; sending again", answer, slot)


# Clients whose slot map must be read again before their next call (a node failed under a call).
_stale: weakref.WeakSet[RedisCluster] = weakref.WeakSet()


def is_cluster(client: object) -> bool:
    """Whether ``client`` is a ``redis.asyncio.RedisCluster``."""
    return isinstance(client, RedisCluster)


async def _ready(client: RedisCluster) -> None:
    # A fresh RedisCluster reads the slot map on first use; redis-py does it in initialize().
    await client.initialize()
    if client in _stale:
        _stale.discard(client)
        try:
            await client.nodes_manager.initialize()
        except BaseException:
            _stale.add(client)
            raise


def mark_stale(client: RedisCluster) -> None:
    """Read ``client``'s slot map again before its next call (one of its nodes failed or hung)."""
    _stale.add(client)


async def cluster_exchange(client: RedisCluster, args: Sequence[Any], route: Any, sent: list[bool],
                           then: Sequence[Any] | None = None, *, node: ClusterNode | None = None) -> Any:
    """Send ``args`` to the node serving ``route``'s slot (or to ``node``) and return the reply (with
    ``then``: as :func:`~.connections.call`). A ``NOSCRIPT`` error carries its ``.node``. ``sent[0]``
    is true while a send may have reached a node that could run it."""
    await _ready(client)
    if node is not None:
        return await _send(node, args, sent, asking=False, then=then)
    slot = client.keyslot(route) if route is not None else None
    target: ClusterNode | None = None  # set by ASK: the next send goes there, after ASKING
    pause_s = _PAUSE_S[0]
    for _attempt in range(_MAX_ATTEMPTS):
        try:
            if target is not None:
                node, asking, target = target, True, None
            else:
                node = client.nodes_manager.get_node_from_slot(slot) if slot is not None else client.get_default_node()
                asking = False
            return await _send(node, args, sent, asking=asking, then=then)
        except MovedError as exc:  # before AskError: MovedError is a subclass of it
            sent[0] = False
            _redirected("MOVED", slot)
            await client.nodes_manager.move_slot(exc)
        except AskError as exc:
            sent[0] = False
            _redirected("ASK", slot)
            target = _node_at(client, exc.host, exc.port)
        except (TryAgainError, ClusterDownError, SlotNotCoveredError) as exc:
            sent[0] = False
            _redirected(_PAUSED.get(type(exc), "CLUSTERDOWN"), slot)
            await asyncio.sleep(pause_s)
            pause_s = min(_PAUSE_S[1], pause_s * 2)
            if isinstance(exc, SlotNotCoveredError):  # this client's map lacks the slot (read mid-failover)
                await client.nodes_manager.initialize()
        except NoScriptError as exc:
            exc.node = node  # type: ignore[attr-defined]  # where to load it (run_script)
            raise
        except ResponseError:
            raise  # the node answered: its own error, not the cluster's
        except (RedisConnectionError, RedisTimeoutError, OSError):
            # Connection lost or refused mid-exchange: the node may be gone (a failover).
            _stale.add(client)
            raise
    raise ClusterDownError(f"no node accepted the command after {_MAX_ATTEMPTS} redirections and pauses")


def _node_at(client: RedisCluster, host: str, port: int) -> ClusterNode:
    """The client's node at ``host:port``; one it has not met yet (an ASK to a node that owns no slot
    yet: CLUSTER SLOTS does not list it) is added, as redis-py does for MOVED."""
    found = client.get_node(host=host, port=port)
    if found is not None:
        return found
    manager = client.nodes_manager
    new = ClusterNode(host, port, PRIMARY, **manager.connection_kwargs)
    manager.set_nodes(manager.nodes_cache, {new.name: new})
    return new


async def _send(node: ClusterNode, args: Sequence[Any], sent: list[bool], *, asking: bool,
                then: Sequence[Any] | None) -> Any:
    commands: list[Sequence[Any]] = [("ASKING",)] if asking else []
    commands.append(args)
    conn = node.acquire_connection()
    try:
        await reconnect_if_closed(conn)
        replies = await exchange(conn, commands, sent, then)
    finally:
        node.release(conn)
    return result(replies[1:] if asking else replies, then)
