"""The take pump's decoding: a pop's items as the entries its waiters get."""

from __future__ import annotations

import logging
from collections.abc import Callable
from itertools import repeat
from typing import Any

from .._recurring.refill import RESYNC
from .._util.observe import Events
from ..exceptions import DecodeError
from .handoff import Pop
from .take_waiters import Entry

__all__ = ["PopDecoder"]

log = logging.getLogger("aiodelayq")


class PopDecoder:
    """Decodes the pops of one pump. ``decode``: a stored payload's item (raising
    :class:`DecodeError`); ``decode_batch``: a whole pop's items at once when all are bare payloads,
    else ``ValueError`` (``_wire.codec.batch_decoder``); ``dead_letter``: the list the undecodable go to
    (named in the log)."""

    def __init__(self, decode: Callable[[bytes], Any], decode_batch: Callable[[list[bytes]], list[Any]] | None,
                 events: Events, dead_letter: str) -> None:
        self._decode, self._decode_batch, self._events, self._dead_letter = decode, decode_batch, events, dead_letter

    def entries(self, pop: Pop, raws: list[bytes]) -> list[Entry]:
        """``pop``'s items as entries: the whole pop in one call when every item is a bare payload,
        else item by item (an undecodable one settled 'x' and counted, a resync settled 'd')."""
        if self._decode_batch is not None:
            try:
                values = self._decode_batch(raws)
            except ValueError:  # an envelope, or a payload json.loads must judge: one at a time below
                pass
            else:  # the common case: bare payloads, no per-item code here
                return list(zip(repeat(pop), range(len(values)), values))
        decode, entries = self._decode, list[Entry]()
        keep = entries.append  # per item: the names bound once
        for index, raw in enumerate(raws):
            try:
                taken = decode(raw)
            except DecodeError as exc:
                self._events.count("undecodable")
                log.error("%s; moved to dead-letter list %r", exc, self._dead_letter)
                pop.settle(index, "x")
                continue
            if taken is RESYNC:
                pop.settle(index, "d")
                continue
            keep((pop, index, taken))
        # Counted when decided: the FINISH that writes them goes out with the pop's other verdicts.
        if len(entries) < len(raws) and (dead := pop.plan.count("x")):
            self._events.dead_lettered(dead, "undecodable")
        return entries
