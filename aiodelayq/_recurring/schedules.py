"""Recurring items: ``schedule(key, item, every=... | cron=...)``.

A schedule is a record in the queue's schedules hash (``lua/lib/recur.lua``) and one keyed pending
occurrence naming the key and its number. Handing an occurrence out schedules the next in the same
script; the record's number moves on with it, so an occurrence handed out again continues nothing.
A cron record lists its next ``CRON_LISTED`` due times; consumers list more (``_recurring/refill.py``).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from .._options import QueueOptions
from .._redis.client_facts import facts_for, server_ms_at
from .._scripts import QueueScripts
from .._util.checks import check_item_bytes
from .._wire.codec import encode_item
from .._wire.delays import positive_ms
from .._wire.elements import pack_headers, pack_times, wrap
from .._wire.item_keys import check_key, key_tag
from ..exceptions import ConfigurationError
from .cron import cron_spec, cron_times

__all__ = ["Schedules"]

_LISTINGS = 3  # cron listings tried when each falls behind the server's clock before its call runs


class Schedules:
    """``schedule`` of one queue object (see :meth:`~aiodelayq.DelayedQueue.schedule`)."""

    def __init__(self, scripts: QueueScripts, options: QueueOptions) -> None:
        self._scripts, self._keys = scripts, scripts.keys
        self._codec, self._max_item_bytes = options.resolved_codec, options.max_item_bytes

    def __repr__(self) -> str:
        return f"<Schedules {self._keys.schedules!r}>"

    async def schedule(self, key: str, item: Any, *, every: float | timedelta | None, cron: str | None,
                       tz: str | None, headers: Mapping[str, str] | None) -> int:
        """Start (or replace) the recurring item of ``key``; returns its first due time (epoch ms)."""
        raw = check_key(key)
        if (every is None) == (cron is None):
            raise ConfigurationError("schedule needs exactly one of every= and cron=")
        if tz is not None and cron is None:
            raise ConfigurationError("tz applies to cron= schedules only")
        every_ms = 0 if every is None else positive_ms(every, "every")
        spec = "" if cron is None else cron_spec(cron, tz)
        envelope = wrap(encode_item(self._codec, item), pack_headers(headers), None, raw)
        check_item_bytes(self._max_item_bytes, [envelope])
        issued = asyncio.get_running_loop().time()
        listed: list[int] = []
        if spec:
            now_ms = await server_ms_at(self._scripts.client, issued, route=self._keys.destination,
                                        timeout_s=self._scripts.call_timeout_s)
            listed = cron_times(spec, now_ms)
        issue_arg = facts_for(self._scripts.client).clock.issue_arg(issued)
        first_number = int.from_bytes(os.urandom(4), "big") >> 1  # never reused for the key (see SCHEDULE)
        for _ in range(_LISTINGS):
            if spec and not listed:
                break
            due, server_now_ms = await self._scripts.schedule.resend(
                raw, key_tag(raw), envelope, every_ms, spec, pack_times(listed), issue_arg, first_number,
                durable=True)
            if due:
                return int(due)
            # Every listed time passed before the call ran (a stalled loop or server, or a short
            # listing of a frequent schedule): list again from the server's clock.
            listed = cron_times(spec, int(server_now_ms))
        raise ConfigurationError(f"cron {cron!r} has no due time after now")
