"""What an open queue runs in the background: the transfer scheduler (``scheduler``), the shared pub/sub
subscriber (``subscriber``), the shared safety poll (``safety_poll``), their registry per client and
event loop (``client_runtime``) and the open/close state machine of a queue object (``lifecycle``)."""
