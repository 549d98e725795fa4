"""Options objects, one per concern, each checked once when made (messages name the option; the rule
for durations is in ``_core/checks.py``): :class:`QueueOptions` (a :class:`~aiodelayq.DelayedQueue`'s)
and :class:`WorkerOptions` (a worker's, whichever way it is started)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.backoff import AbstractBackoff

from ._core import checks
from ._redis.connections import AnyRedis
from ._redis.durability import Durability
from ._wire.codec import Codec, resolve_codec
from ._wire.delays import MIN_VISIBILITY_TIMEOUT_S
from ._wire.elements import ElementKind, element_kind
from .exceptions import ConfigurationError

__all__ = ["MIN_TIER_AFTER_S", "QueueOptions", "WireFormat", "WorkerOptions", "check_client"]

MIN_TIER_AFTER_S = 1.0
"""The shortest ``tier_after_s``, seconds (the tier is for items due far ahead)."""

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

    ``tier_after_ms`` is ``tier_after_s`` in whole ms (rounded up), as OFFER takes it.
    """

    codec: Codec
    wire_format: WireFormat
    kind: ElementKind
    max_deliveries: int | None
    transfer_batch: int
    safety_poll_s: float
    open_timeout_s: float
    close_timeout_s: float
    call_timeout_s: float
    max_call_bytes: int
    durability: Durability
    max_pending: int | None = None
    max_item_bytes: int | None = None
    lag_warning_s: float | None = None
    tier_after_ms: int | None = None

    @classmethod
    def build(cls, *, codec: str | Codec, wire_format: str, strict: bool, max_deliveries: int | None,
              transfer_batch: int, safety_poll_s: float, open_timeout_s: float, close_timeout_s: float,
              call_timeout_s: float, max_call_bytes: int, min_replicas: int = 0,
              replication_timeout_s: float = 1.0, wait_aof: bool = False, max_pending: int | None = None,
              max_item_bytes: int | None = None, lag_warning_s: float | None = None,
              tier_after_s: float | None = None) -> QueueOptions:
        """Check every option.

        Raises:
            ConfigurationError: the first bad option, named.
        """
        if wire_format not in ("redisson", "redisson-legacy"):
            raise ConfigurationError(f"wire_format must be 'redisson' or 'redisson-legacy', not {wire_format!r}")
        if not isinstance(strict, bool):
            raise ConfigurationError(f"strict must be a bool, not {strict!r}")
        if max_deliveries is not None:
            checks.count("max_deliveries", max_deliveries, minimum=1)
        checks.count("transfer_batch", transfer_batch, minimum=1, maximum=10_000)
        checks.count("max_call_bytes", max_call_bytes, minimum=1024)
        if max_pending is not None:
            checks.count("max_pending", max_pending, minimum=1)
        if max_item_bytes is not None:
            checks.count("max_item_bytes", max_item_bytes, minimum=1)
        if lag_warning_s is not None:
            lag_warning_s = checks.seconds("lag_warning_s", lag_warning_s, above_minimum=True)
        kind = element_kind(strict=strict, wire_format=wire_format)
        tier_after_ms = None
        if tier_after_s is not None:
            tier_after_ms = math.ceil(checks.seconds("tier_after_s", tier_after_s, minimum_s=MIN_TIER_AFTER_S) * 1000)
            if kind != "fast":
                raise ConfigurationError("tier_after_s tiers fast elements only: it needs strict=False and "
                                         f"wire_format='redisson', not {kind} elements")
        durations = {name: checks.seconds(name, value, above_minimum=True) for name, value in (
            ("safety_poll_s", safety_poll_s), ("open_timeout_s", open_timeout_s),
            ("close_timeout_s", close_timeout_s), ("call_timeout_s", call_timeout_s))}
        try:
            resolved = resolve_codec(codec)
        except (TypeError, ValueError) as exc:
            raise ConfigurationError(str(exc)) from exc
        return cls(codec=resolved, wire_format=wire_format,  # type: ignore[arg-type]
                   kind=kind, max_deliveries=max_deliveries,
                   transfer_batch=transfer_batch, max_call_bytes=max_call_bytes, **durations,
                   durability=Durability.build(min_replicas, replication_timeout_s, wait_aof),
                   max_pending=max_pending, max_item_bytes=max_item_bytes, lag_warning_s=lag_warning_s,
                   tier_after_ms=tier_after_ms)


@dataclass(frozen=True)
class WorkerOptions:
    """How a worker runs a handler on a queue's items: one set of options, checked here, for every way
    a worker starts (:meth:`DelayedQueue.consume`, :meth:`DelayedQueue.worker`,
    :meth:`Queues.add_worker`, :func:`aiodelayq.worker.run_worker` and ``aiodelayq worker``, each
    taking these names as keywords or flags).

    Attributes:
        concurrency: handlers running at once (an ``int`` >= 1).
        visibility_timeout_s: seconds a received message stays invisible to other consumers (at least
            ``MIN_VISIBILITY_TIMEOUT_S``); a slow handler's message is extended every third of it.
        reliable: ``True``: at least once (receive, ack on return, nack on failure); ``False``: at most
            once (``take_many``: a failure is logged with the item, which is gone).
        drain_timeout_s: on :meth:`Worker.stop`, seconds running handlers get to finish before they
            are cut off and their messages handed back (0: at once).
        retry_backoff: the delay before a failed message is delivered again, from its delivery count
            (at most 64, so that no backoff overflows) (a redis-py backoff; ``None``:
            ``EqualJitterBackoff(cap=300, base=1)``).

    Raises:
        ConfigurationError: a bad option, named.
    """

    concurrency: int = 16
    visibility_timeout_s: float = 30.0
    reliable: bool = True
    drain_timeout_s: float = 30.0
    retry_backoff: AbstractBackoff | None = None

    def __post_init__(self) -> None:
        checks.count("concurrency", self.concurrency, minimum=1)
        object.__setattr__(self, "visibility_timeout_s", checks.seconds(
            "visibility_timeout_s", self.visibility_timeout_s, minimum_s=MIN_VISIBILITY_TIMEOUT_S))
        object.__setattr__(self, "drain_timeout_s", checks.seconds("drain_timeout_s", self.drain_timeout_s))
        if not isinstance(self.reliable, bool):
            raise ConfigurationError(f"reliable must be a bool, not {self.reliable!r}")
        if self.retry_backoff is not None and not isinstance(self.retry_backoff, AbstractBackoff):
            raise ConfigurationError(
                f"retry_backoff must be a redis.backoff.AbstractBackoff, not {self.retry_backoff!r}")
