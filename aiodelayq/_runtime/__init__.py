"""What an open queue runs in the background: the transfer task (``transfer_task``), the shared pub/sub
subscriber (``subscriber``), the shared safety poll (``safety_poll``), their registry per client and
event loop (``client_runtime``), the open/close state machine of a queue object (``lifecycle``) and
the consumers it attaches to the transfer task (``consumers``).

An item's path: ``_producing/producer.py`` (OFFER publishes a new earliest due time) ->
``transfer_task.py`` (a timer, then TRANSFER) -> ``consumers.py`` -> ``_consuming/take.py`` (POP) or
``_consuming/reliable.py`` (RECEIVE). The safety poll (``safety_poll.py``) catches what nothing
announced (a lost publish, another process's moves, a dead process's lease).
"""
