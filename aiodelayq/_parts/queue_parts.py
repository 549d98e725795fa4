"""The parts of one ordinary queue (``shards=1``) or of one shard of a sharded one, each filling a role
of ``roles.py``."""

from __future__ import annotations

from dataclasses import dataclass

from .._consuming.controls import Controls
from .._contents.contents import QueueContents
from .._contents.dead_letters import DeadLetters
from .._contents.event_stream import EventStream
from .._options import QueueOptions
from .._producing.keyed import KeyedItems
from .._producing.producer import Producer
from .._recurring.schedules import Schedules
from .._redis.connections import AnyRedis
from .._runtime.lifecycle import Lifecycle
from .._scripts import QueueScripts
from .._util.observe import Events
from .._wire.key_names import QueueKeys

__all__ = ["QueueParts"]


@dataclass(frozen=True)
class QueueParts:
    """One ordinary queue's scripts (bound to its client and keys) and the components built on them."""

    keys: QueueKeys
    scripts: QueueScripts
    events: Events
    producer: Producer
    pending: QueueContents
    keyed: KeyedItems
    dead: DeadLetters
    controls: Controls
    event_stream: EventStream
    schedules: Schedules
    life: Lifecycle

    def shard_keys(self) -> tuple[QueueKeys, ...]:
        """The keys of the queue's one shard: its own."""
        return (self.keys,)

    @classmethod
    def build(cls, client: AnyRedis, keys: QueueKeys, options: QueueOptions, *, rotation: int = 1) -> QueueParts:
        """The components of the queue ``keys`` on ``client`` with ``options`` (``rotation``: the
        shard count when it is one shard of a sharded queue, see ``_consuming/take.py``). Its OFFER and TRANSFER
        refuse a name that records a shard count (``ShardCountError``): an ordinary queue object on a
        sharded queue's name neither writes nor opens there."""
        o = options
        scripts = QueueScripts(client, keys, call_timeout_s=o.call_timeout_s, durability=o.durability)
        events = Events(keys.destination)
        producer = Producer(scripts, o, events)
        codec = o.resolved_codec
        return cls(keys, scripts, events, producer, QueueContents(scripts, codec), KeyedItems(scripts, codec),
                   DeadLetters(scripts, codec, o.kind), Controls(scripts), EventStream(scripts), Schedules(scripts, o),
                   Lifecycle(scripts, o, events, on_new_loop=producer.rebind, rotation=rotation))
