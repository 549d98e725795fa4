"""The pending side: offers (``producer``, coalesced by ``batcher``), keyed items (``keyed``), walks and
counts of what is pending (``pending``) and the dead-letter list (``dead_letters``)."""
