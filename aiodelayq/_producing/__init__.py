"""Writing items: offers (``producer``, coalesced by ``batcher``, sized by ``call_cost``) and the calls
on an item by its key (``keyed``). Recurring items are ``_recurring/``'s."""
