"""A sharded queue's parts: K ordinary queues' (``_parts/queue_parts.py``, placed by
:class:`.shard_set.ShardSet`) and the composites over them that fill the roles of ``_parts/roles.py``."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from .._options import QueueOptions
from .._parts.queue_parts import QueueParts
from .._redis.connections import AnyRedis
from .._scripts import QueueScripts
from .._util.observe import Events
from .._wire.key_names import QueueKeys
from .contents import ShardedContents
from .controls import ShardedControls
from .dead_letters import ShardedDeadLetters
from .event_stream import ShardedEventStream
from .keyed import ShardedKeyed, ShardedSchedules
from .layout import Rotation
from .lifecycle import ShardedLifecycle
from .offers import ShardedProducer
from .record import ShardCount
from .shard_set import ShardSet

__all__ = ["ShardedParts"]


@dataclass(frozen=True)
class ShardedParts:
    """The shards of a sharded queue and the composites over them."""

    placed: ShardSet
    producer: ShardedProducer
    pending: ShardedContents
    keyed: ShardedKeyed
    dead: ShardedDeadLetters
    controls: ShardedControls
    event_stream: ShardedEventStream
    schedules: ShardedSchedules
    life: ShardedLifecycle

    def shard_keys(self) -> tuple[QueueKeys, ...]:
        """The keys of every shard, in shard order (where they are is read from Redis on first use)."""
        return self.placed.keys()

    @classmethod
    def build(cls, client: AnyRedis, keys: QueueKeys, options: QueueOptions, shards: int) -> ShardedParts:
        """The ``shards`` shards of the queue whose own keys are ``keys`` (they hold only the recorded
        shards), with ``options``; ``capacity`` is split over the shards (each holds at most
        ``ceil(capacity / shards)`` items)."""
        o = options
        if o.capacity is not None:
            o = dataclasses.replace(o, capacity=math.ceil(o.capacity / shards))
        placed = ShardSet(keys.destination, shards,
                          lambda name: QueueParts.build(client, QueueKeys.for_name(name), o, rotation=shards))
        scripts = QueueScripts(client, keys, call_timeout_s=o.call_timeout_s, durability=o.durability)
        producer = ShardedProducer(scripts, o, Events(keys.destination), placed.of(lambda p: p.producer),
                                   Rotation(shards))
        # The count check may be the first call of an opening: bounded by the shorter of the two.
        count = ShardCount(scripts, shards, timeout_s=min(o.call_timeout_s, o.open_timeout_s), place=placed.place)
        life = ShardedLifecycle(keys.destination, placed.of(lambda p: p.life), count, recheck_s=o.safety_poll_s)
        return cls(placed, producer, ShardedContents(placed.of(lambda p: p.pending)),
                   ShardedKeyed(placed.of(lambda p: p.keyed)), ShardedDeadLetters(placed.of(lambda p: p.dead)),
                   ShardedControls(placed.of(lambda p: p.controls)),
                   ShardedEventStream(placed.of(lambda p: p.event_stream)),
                   ShardedSchedules(placed.of(lambda p: p.schedules)), life)
