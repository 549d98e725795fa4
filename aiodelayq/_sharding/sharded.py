"""A sharded queue's components: K ordinary queues (:class:`.parts.QueueParts`, one per shard, each
with the queue's options), and the composites over them the facade delegates to."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from .._core.observe import Events
from .._options import QueueOptions
from .._redis.connections import AnyRedis
from .._scripts import QueueScripts
from .._wire.key_names import QueueKeys, shard_names
from .controls import ShardedControls
from .dead_letters import ShardedDeadLetters
from .keyed import ShardedKeyed, ShardedSchedules
from .layout import Rotation
from .lifecycle import ShardedLifecycle
from .offers import ShardedProducer
from .parts import QueueParts, check_timeout_s
from .pending import ShardedPending
from .record import ShardCount

__all__ = ["ShardedParts"]


@dataclass(frozen=True)
class ShardedParts:
    """The shards of a sharded queue and the composites over them."""

    shards: tuple[QueueParts, ...]
    producer: ShardedProducer
    pending: ShardedPending
    keyed: ShardedKeyed
    dead: ShardedDeadLetters
    controls: ShardedControls
    schedules: ShardedSchedules
    life: ShardedLifecycle

    @classmethod
    def build(cls, client: AnyRedis, keys: QueueKeys, options: QueueOptions, shards: int) -> ShardedParts:
        """The ``shards`` shards of the queue whose own keys are ``keys`` (they hold only the recorded
        shard count), with ``options``; ``max_pending`` is split over the shards (each holds at most
        ``ceil(max_pending / shards)`` items)."""
        o = options
        if o.max_pending is not None:
            o = dataclasses.replace(o, max_pending=math.ceil(o.max_pending / shards))
        names = shard_names(keys.destination, shards)
        parts = tuple(QueueParts.build(client, QueueKeys.for_name(name), o, rotation=shards) for name in names)
        scripts = QueueScripts(client, keys, call_timeout_s=o.call_timeout_s, durability=o.durability)
        producer = ShardedProducer(scripts, o, Events(keys.destination), [p.producer for p in parts],
                                   Rotation(shards))
        count = ShardCount(scripts, shards, timeout_s=check_timeout_s(o))
        life = ShardedLifecycle(keys.destination, [p.life for p in parts], count, recheck_s=o.safety_poll_s)
        return cls(parts, producer, ShardedPending([p.pending for p in parts]), ShardedKeyed([p.keyed for p in parts]),
                   ShardedDeadLetters([p.dead for p in parts]), ShardedControls([p.controls for p in parts]),
                   ShardedSchedules([p.schedules for p in parts]), life)

    @property
    def shard_keys(self) -> tuple[QueueKeys, ...]:
        """Each shard's keys, in shard order."""
        return tuple(p.keys for p in self.shards)

