"""Writing items: offers (``producer``, coalesced by ``batcher``, sized by ``call_cost``), the calls
on an item by its key (``keyed``) and recurring items (``recurring``)."""
