"""A queue larger than one shard: ``DelayedQueue(client, name, shards=K)`` is K ordinary queues on
evenly spaced cluster slots (``_wire/placement.py``; ``docs/design.md``, "A queue larger than one shard").
For K > 1 the facade's components are composites over the K shards' (:mod:`.sharded`), one concern per module.
"""
