"""Consumers list more due times of cron schedules (see ``_recurring/schedules.py``).

An occurrence handed out with few listed times left is flagged; its consumer computes more and
appends them (REFILL) in the background. REFILL skips times already listed, so concurrent refills
list each once, and restarts a stalled schedule.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from .._redis.backoff import Backoff
from .._redis.client_facts import server_ms_at
from .._redis.retry import call_idempotent
from .._scripts import QueueScripts
from .._util.tasks import TaskOwner
from .._wire.codec import Codec, Headed, decode_item, scanning
from .._wire.elements import ITEM_MARK, Unwrapped, pack_times, parse_schedule, unwrap
from ..exceptions import BackendError, ConfigurationError
from .cron import cron_times

__all__ = ["CronRefill"]

RESYNC = object()
"""What ``decode`` returns for a stalled recurring item's resync: settled as taken, handed to nobody."""

log = logging.getLogger("aiodelayq")

# Tries of one refill before it is left to the next flagged occurrence.
_TRIES = 5


class CronRefill:
    """The refills of one queue object's consumers, one at a time per schedule key."""

    def __init__(self, scripts: QueueScripts, tasks: TaskOwner) -> None:
        self._scripts, self._keys, self._tasks = scripts, scripts.keys, tasks
        self._running: set[str] = set()

    def __repr__(self) -> str:
        return f"<CronRefill {self._keys.schedules!r} running={len(self._running)}>"

    def decoder(self, codec: Codec) -> Any:
        """A take pump's decode function: the item of a stored payload, as a :class:`Headed` when it
        has headers, :data:`RESYNC` for a stalled schedule's resync (nothing to hand out); starts a
        refill for a flagged occurrence or a resync."""

        def decode(raw: bytes) -> Any:
            if raw[:1] != ITEM_MARK:
                return decode_item(codec, raw)
            unwrapped = unwrap(raw)
            if self.handed_out(unwrapped, raw):
                return RESYNC
            value = decode_item(codec, unwrapped.payload)
            return Headed(value, unwrapped.headers) if unwrapped.headers else value

        return scanning(codec, decode)

    def handed_out(self, unwrapped: Unwrapped, payload: bytes) -> bool:
        """A consumer got ``payload`` (``unwrapped`` its parts): start a refill if its script
        flagged it; returns whether it is a resync (nothing to deliver)."""
        if (unwrapped.refill or unwrapped.resync) and unwrapped.schedule_key is not None:
            self.soon(unwrapped.schedule_key, payload)
        return unwrapped.resync

    def soon(self, key: str, payload: bytes) -> None:
        """List more times of ``key``'s schedule, in the background (once at a time per key)."""
        if key in self._running:
            return
        self._running.add(key)
        self._tasks.spawn(self._refill(key, payload), name=f"aiodelayq-refill:{self._keys.destination}:{key}")

    async def _refill(self, key: str, payload: bytes) -> None:
        backoff = Backoff(f"listing cron times of {key!r} on {self._keys.destination!r}")
        try:
            for _ in range(_TRIES):
                try:
                    if await self._once(key, payload):
                        return
                except BackendError as exc:
                    await asyncio.sleep(backoff.failed(exc))
                except ConfigurationError as exc:  # croniter is missing in this process
                    log.warning("cannot list cron times of %r on %r: %s", key, self._keys.destination, exc)
                    return
        finally:
            self._running.discard(key)

    async def _once(self, key: str, payload: bytes) -> bool:
        """One listing; False when every time it listed had passed before REFILL ran (a stalled loop
        or server, or a short listing of a frequent schedule): list again, from a later clock."""
        scripts = self._scripts
        record = await call_idempotent(scripts.client, "HGET", self._keys.schedules, key, what="read a schedule",
                                       timeout_s=scripts.call_timeout_s, route=self._keys.schedules)
        if record is None:
            return True  # cancelled
        parsed = parse_schedule(record)
        if not parsed.spec:
            return True
        now_ms = await server_ms_at(scripts.client, asyncio.get_running_loop().time(), route=self._keys.destination,
                                    timeout_s=scripts.call_timeout_s)
        after = max(now_ms, parsed.times_ms[-1]) if parsed.times_ms else now_ms
        times = cron_times(parsed.spec, after)
        listed = await scripts.refill.resend(key, payload, pack_times(times), parsed.spec, durable=True)
        return not times or listed != 0
