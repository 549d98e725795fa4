"""Handing due items out: plain takes (``take``, its phases and waiters, through the leased hand-off
``handoff``, with ``prefetch``), reliable receives (``reliable``, ``messages``, their settles
``settler`` and leases ``lease``), the wait loop and span they share (``wait_loop``, ``traced``), the
controls, and the worker (``worker_slots``, ``worker_fetch``, ``worker_outcomes``, ``worker_stop``,
``handler``, ``priority``)."""
