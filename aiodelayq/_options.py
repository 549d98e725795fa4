"""The options of one :class:`~aiodelayq.DelayedQueue`, checked once when the queue is made."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

from ._redis.connections import AnyRedis
from ._redis.durability import Durability
from ._wire.codec import Codec, resolve_codec
from ._wire.elements import ElementKind, element_kind
from .exceptions import ConfigurationError

__all__ = ["QueueOptions", "WireFormat", "check_client"]

WireFormat = Literal["redisson", "redisson-legacy"]
"""How this producer packs pending elements: ``"redisson"`` (Redisson >= 3.21.1, ``Bc0Lc0``: fast or
strict elements) or ``"redisson-legacy"`` (older Redisson, ``dLc0``: legacy elements). Reading always
accepts every kind."""


def check_client(client: object) -> AnyRedis:
    """Accept a ``redis.asyncio.Redis`` (a single server, or a primary from ``Sentinel.master_for``) or
    a ``redis.asyncio.RedisCluster`` that returns bytes.

    Raises:
        ConfigurationError: another object, or a client with ``decode_responses=True``.
    """
    kwargs: dict[str, Any]
    if isinstance(client, Redis):
        kwargs = client.connection_pool.connection_kwargs
    elif isinstance(client, RedisCluster):
        kwargs = client.get_connection_kwargs()
    else:
        raise ConfigurationError("client must be a redis.asyncio.Redis or redis.asyncio.RedisCluster, "
                                 f"not {type(client).__name__}")
    if kwargs.get("decode_responses"):
        raise ConfigurationError("the client must not decode responses: use decode_responses=False")
    return client


@dataclass(frozen=True)
class QueueOptions:
    """Checked options (see :class:`~aiodelayq.DelayedQueue` for their meaning; seconds in ``*_s``).

    ``max_deliveries`` is 0 for "no limit", as the scripts take it.
    """

    codec: Codec
    wire_format: WireFormat
    kind: ElementKind
    max_deliveries: int
    transfer_batch: int
    safety_poll_s: float
    open_timeout_s: float
    close_timeout_s: float
    call_timeout_s: float
    max_call_bytes: int
    durability: Durability

    @classmethod
    def build(cls, *, codec: str | Codec, wire_format: str, strict: bool, max_deliveries: int | None,
              transfer_batch: int, safety_poll_s: float, open_timeout_s: float, close_timeout_s: float,
              call_timeout_s: float, max_call_bytes: int, min_replicas: int = 0,
              replication_timeout_s: float = 1.0, wait_aof: bool = False) -> QueueOptions:
        """Check every option.

        Raises:
            ConfigurationError: the first bad option, named.
        """
        if wire_format not in ("redisson", "redisson-legacy"):
            raise ConfigurationError(f"wire_format must be 'redisson' or 'redisson-legacy', not {wire_format!r}")
        if max_deliveries is not None and (not isinstance(max_deliveries, int) or max_deliveries < 1):
            raise ConfigurationError("max_deliveries must be None or an int >= 1")
        if not isinstance(transfer_batch, int) or not 1 <= transfer_batch <= 10_000:
            raise ConfigurationError("transfer_batch must be an int in 1..10000")
        if not isinstance(max_call_bytes, int) or max_call_bytes < 1024:
            raise ConfigurationError("max_call_bytes must be an int >= 1024")
        seconds = {"safety_poll_s": safety_poll_s, "open_timeout_s": open_timeout_s,
                   "close_timeout_s": close_timeout_s, "call_timeout_s": call_timeout_s}
        for label, value in seconds.items():
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 < value < math.inf:
                raise ConfigurationError(f"{label} must be a positive number of seconds")
        try:
            resolved = resolve_codec(codec)
        except (TypeError, ValueError) as exc:
            raise ConfigurationError(str(exc)) from exc
        return cls(codec=resolved, wire_format=wire_format,  # type: ignore[arg-type]
                   kind=element_kind(strict=strict, wire_format=wire_format), max_deliveries=max_deliveries or 0,
                   transfer_batch=transfer_batch, safety_poll_s=float(safety_poll_s),
                   open_timeout_s=float(open_timeout_s), close_timeout_s=float(close_timeout_s),
                   call_timeout_s=float(call_timeout_s), max_call_bytes=max_call_bytes,
                   durability=Durability.build(min_replicas, replication_timeout_s, wait_aof))
