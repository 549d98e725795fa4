"""A queue larger than one shard: ``DelayedQueue(client, name, shards=K)`` is K ordinary queues,
``{name:0}`` ... ``{name:K-1}``, in different cluster slots (``docs/design.md``, "A queue larger than
one shard").

The queue facade delegates to the same components whatever K is: for K = 1 those of one ordinary
queue (:mod:`.parts`), for K > 1 composites over the K shards' components (:mod:`.sharded`), each of
one concern: where an item goes (:mod:`.layout`), the shard count recorded under the name
(:mod:`.record`), offers (:mod:`.offers`), keyed calls (:mod:`.keyed`), the pending side
(:mod:`.pending`), dead letters (:mod:`.dead_letters`), controls (:mod:`.controls`), taking
(:mod:`.take`), receiving (:mod:`.receive`) and the open/close life (:mod:`.lifecycle`).
"""
