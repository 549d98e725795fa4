"""What a :class:`~aiodelayq.DelayedQueue` delegates to: a protocol per role (``roles``) and the parts
of one ordinary queue (``queue_parts``). A sharded queue's composites (``_sharding/``) fill the same
roles over K ordinary queues' parts."""
