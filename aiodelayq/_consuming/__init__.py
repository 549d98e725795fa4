"""Handing due items out: plain takes (``take``, through the leased hand-off ``handoff``, with
``prefetch``), reliable receives (``reliable``, ``messages``, their settles ``settler`` and leases
``lease``) and the handler pool (``worker``)."""
