"""Options objects, one per concern, each checked once when made."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from functools import cached_property
from typing import Any, Literal

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.backoff import AbstractBackoff

from ._redis.connections import AnyRedis
from ._redis.durability import Durability
from ._util import checks
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


@dataclass(frozen=True, kw_only=True)
class QueueOptions:
    """A queue's options, declared once here and checked when made (meaning: :class:`~aiodelayq.DelayedQueue`,
    which spells out the same keywords; a test keeps the two alike).

    Raises:
        ConfigurationError: the first bad option, named.
    """

    codec: str | Codec = "json"
    wire_format: WireFormat = "redisson"
    strict: bool = False
    max_deliveries: int | None = None
    transfer_batch: int = 500
    safety_poll_s: float = 5.0
    open_timeout_s: float = 10.0
    close_timeout_s: float = 5.0
    call_timeout_s: float = 5.0
    max_call_bytes: int = 1_000_000
    min_replicas: int = 0
    replication_timeout_s: float = 1.0
    wait_aof: bool = False
    capacity: int | None = None
    max_item_bytes: int | None = None
    lag_warning_s: float | None = 60.0
    tier_after_s: float | None = None
    resolved_codec: Codec = field(init=False, repr=False, compare=False)
    """The codec object of ``codec`` (a name or an object)."""

    def __post_init__(self) -> None:
        if self.wire_format not in ("redisson", "redisson-legacy"):
            raise ConfigurationError(f"wire_format must be 'redisson' or 'redisson-legacy', not {self.wire_format!r}")
        if not isinstance(self.strict, bool):
            raise ConfigurationError(f"strict must be a bool, not {self.strict!r}")
        if self.max_deliveries is not None:
            checks.count("max_deliveries", self.max_deliveries, minimum=1)
        checks.count("transfer_batch", self.transfer_batch, minimum=1, maximum=10_000)
        checks.count("max_call_bytes", self.max_call_bytes, minimum=1024)
        if self.capacity is not None:
            checks.count("capacity", self.capacity, minimum=1)
        if self.max_item_bytes is not None:
            checks.count("max_item_bytes", self.max_item_bytes, minimum=1)
        if self.lag_warning_s is not None:
            self._set("lag_warning_s", checks.seconds("lag_warning_s", self.lag_warning_s, above_minimum=True))
        if self.tier_after_s is not None:
            self._set("tier_after_s", checks.seconds("tier_after_s", self.tier_after_s, minimum_s=MIN_TIER_AFTER_S))
            if self.kind != "fast":
                raise ConfigurationError("tier_after_s tiers fast elements only: it needs strict=False and "
                                         f"wire_format='redisson', not {self.kind} elements")
        for name in ("safety_poll_s", "open_timeout_s", "close_timeout_s", "call_timeout_s"):
            self._set(name, checks.seconds(name, getattr(self, name), above_minimum=True))
        try:
            self._set("resolved_codec", resolve_codec(self.codec))
        except (TypeError, ValueError) as exc:
            raise ConfigurationError(str(exc)) from exc
        self.durability  # noqa: B018 - checks min_replicas, replication_timeout_s, wait_aof

    def _set(self, name: str, value: object) -> None:
        object.__setattr__(self, name, value)  # a checked value (a float for an int), once, in __post_init__

    @classmethod
    def of(cls, arguments: Mapping[str, Any]) -> QueueOptions:
        """The options among ``arguments`` (``DelayedQueue.__init__``'s ``locals()``): each field's
        value by its name."""
        return cls(**{f.name: arguments[f.name] for f in fields(cls) if f.init})

    @cached_property
    def kind(self) -> ElementKind:
        """The kind of element this queue object writes (``strict`` and ``wire_format``)."""
        return element_kind(strict=self.strict, wire_format=self.wire_format)

    @cached_property
    def durability(self) -> Durability:
        """How durable writes are confirmed (``min_replicas``, ``replication_timeout_s``, ``wait_aof``)."""
        return Durability.build(self.min_replicas, self.replication_timeout_s, self.wait_aof)

    @cached_property
    def tier_after_ms(self) -> int | None:
        """``tier_after_s`` in whole ms (rounded up), as OFFER takes it."""
        return None if self.tier_after_s is None else math.ceil(self.tier_after_s * 1000)


@dataclass(frozen=True)
class WorkerOptions:
    """How a worker runs a handler on a queue's items, for every way a worker starts (each entry point
    takes these names and defaults; a test keeps them alike).

    Attributes:
        concurrency: handlers running at once (an ``int`` >= 1).
        visibility_timeout_s: seconds a received message stays invisible to other consumers (at least
            ``MIN_VISIBILITY_TIMEOUT_S``); a slow handler's message is extended every third of it.
        reliable: ``True``: at least once (receive, ack on return, nack on failure); ``False``: at most
            once (``take_many``: a failure is logged with the item, which is gone).
        drain_timeout_s: on :meth:`Worker.stop`, seconds running handlers get to finish before they
            are cut off and their messages handed back (0: at once).
        retry_backoff: a redis-py backoff giving the delay before a failed message is delivered
            again, from its delivery count (capped at 64 against overflow); ``None``:
            ``EqualJitterBackoff(cap=300, base=1)``.

    Raises:
        ConfigurationError: a bad option, named.
    """

    concurrency: int = 16
    visibility_timeout_s: float = 30.0
    reliable: bool = True
    drain_timeout_s: float = 30.0
    retry_backoff: AbstractBackoff | None = None

    @classmethod
    def of(cls, arguments: Mapping[str, Any]) -> WorkerOptions:
        """The options among ``arguments`` (an entry point's ``locals()``), defaults for the others."""
        return cls(**{f.name: arguments[f.name] for f in fields(cls) if f.name in arguments})

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
