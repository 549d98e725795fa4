"""What an open queue runs in the background: the transfer task (``transfer_task``), the shared pub/sub
subscriber (``subscriber``), the shared safety poll (``safety_poll``), their registry per client and
event loop (``client_runtime``), the open/close state machine of a queue object (``lifecycle``) and
the consumers it attaches to the transfer task (``consumers``).

The path of an item, top-down in four modules:

1. ``_producing/producer.py``: ``offer`` runs the OFFER script, which adds the item to the timeout
   zset and, when it is the new earliest, publishes its due time on the queue's channel.
2. ``transfer_task.py``: the subscriber hands the due time to the transfer task of every process with the
   queue open (:meth:`TransferTask.on_due`), which arms a ``loop.call_at`` timer; at the due
   time it runs the TRANSFER script (or lets a waiting take pump's POP run it), which moves the due
   items to the destination list.
3. ``consumers.py``: the transfer task tells each open queue object's consumers how many items wait.
4. ``_consuming/take.py``: the take pump POPs them and hands them to the callers of ``take`` and
   ``async for`` (``_consuming/reliable.py``: RECEIVE, for ``receive``).

Three things move due items, each when the others may not: the transfer (on its timer, a
published due time, a resubscribe); a POP that transfers first, when a caller waits as a transfer
falls due; and the safety poll (``safety_poll.py``), within ``safety_poll_s`` of the last transfer,
for what nothing announced (a publish lost, items another process moved, a dead process's lease),
which wakes the transfer.
"""
