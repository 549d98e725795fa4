"""A queue larger than one shard: ``DelayedQueue(client, name, shards=K)`` is K ordinary queues on
evenly spaced cluster slots (``_wire/placement.py``; ``docs/design.md``, "A queue larger than one
shard").

The queue facade delegates to the same components whatever K is: for K = 1 those of one ordinary
queue (:mod:`.parts`), for K > 1 composites over the K shards' components (:mod:`.sharded`), each of
one concern: where an item goes (:mod:`.layout`), the shards recorded under the name (:mod:`.record`)
and placed as recorded (:mod:`.shard_set`), offers (:mod:`.offers`), keyed calls (:mod:`.keyed`), the pending side
(:mod:`.pending`), dead letters (:mod:`.dead_letters`), controls (:mod:`.controls`), taking
(:mod:`.take`), receiving (:mod:`.receive`) and the open/close life (:mod:`.lifecycle`).
"""
