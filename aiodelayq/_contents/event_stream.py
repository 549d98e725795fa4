"""A queue's event stream (``set_events``, ``events()``): one entry per change to an item, which the
scripts append in the call that makes the change while the stream is on (``lua/lib/events.lua``),
read back as :class:`QueueEvent`.

The stream is the key ``event_stream`` of the queue's slot, capped near its ``maxlen`` (``XADD ...
MAXLEN ~``); the cap sits in the controls hash, so every process writes to it once one turns it on.
Reading follows it with blocking ``XREAD`` calls of at most :data:`BLOCK_MS`, each on a connection
of its own for its duration (cancelled: the connection is dropped, never returned half-read).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Literal

from .._redis.backoff import Backoff
from .._redis.connections import call, is_permanent
from .._redis.retry import call_idempotent
from .._scripts import QueueScripts
from .._util.checks import count
from .._wire.elements import DeadReason, dead_reason
from ..exceptions import BackendError, ConfigurationError

__all__ = ["BLOCK_MS", "EventKind", "EventStream", "QueueEvent", "check_start", "parse_event"]

EventKind = Literal["offered", "delivered", "acked", "nacked", "released", "dead_lettered", "expired", "cancelled",
                    "rescheduled", "requeued", "deduplicated"]
# The longest a following read blocks on the server (ms): bounds how late a follower sees that the
# queue object closed, and the call's timeout (this plus call_timeout_s).
BLOCK_MS = 1000
# Entries one read returns at most.
PAGE = 100


@dataclass(frozen=True)
class QueueEvent:
    """One change to one item, as the script that made it recorded it (``q.events()``).

    Attributes:
        id: the stream entry's id, ``"<ms>-<n>"``: ``q.events(start=id)`` goes on after it.
        kind: ``"offered"`` (written by an offer, or replaced), ``"delivered"`` (handed out by a take
            or a receive), ``"acked"``, ``"nacked"``, ``"released"`` (a delivery nobody saw given
            back: a prefetched or cancelled receive), ``"dead_lettered"`` (see ``reason``),
            ``"expired"`` (dead-lettered: its ``expires`` passed before a consumer got it),
            ``"cancelled"``, ``"rescheduled"``, ``"requeued"`` (a dead letter back in the queue) or
            ``"deduplicated"`` (an offer of a taken key that wrote nothing).
        at_ms: when it happened, server epoch ms (the id's first part).
        key: the item's key, where the call knew it (offers, cancel, reschedule); a delivered item
            has none.
        message_id: the message id of a reliable delivery and its settles (hex, as ``Message.id``).
        group: the item's group, if it has one.
        reason: why it was dead-lettered (``DeadLetter.reason``), for ``"dead_lettered"``.
        delivery_count: the deliveries it had, where the change concerns a delivery.
    """

    id: str
    kind: EventKind
    at_ms: int
    key: str | None = None
    message_id: str | None = None
    group: str | None = None
    reason: DeadReason | None = None
    delivery_count: int | None = None


def parse_event(entry_id: bytes, flat: list[bytes]) -> QueueEvent:
    """One stream entry, its id and its fields and values in turn, as a :class:`QueueEvent` (fields:
    ``lua/lib/events.lua``)."""
    text = entry_id.decode()
    fields = dict(zip(flat[::2], flat[1::2], strict=False))
    key, msg, group, n, reason = (fields.get(f) for f in (b"key", b"id", b"g", b"n", b"r"))
    return QueueEvent(
        id=text, kind=fields.get(b"k", b"?").decode(errors="replace"),  # type: ignore[arg-type]
        at_ms=int(text.split("-", 1)[0]),
        key=None if key is None else key.decode(errors="replace"),
        message_id=None if msg is None else msg.hex(),
        group=None if group is None else group.decode(errors="replace"),
        reason=None if reason is None else dead_reason(int(reason)),
        delivery_count=None if n is None else int(n))


def check_start(start: str) -> str:
    """``start`` as given to ``events()``: ``"$"`` (what comes next), ``"0"`` or ``"-"`` (everything
    stored), or an entry id ``"<ms>"``/``"<ms>-<n>"`` (what comes after it).

    Raises:
        ConfigurationError: anything else; nothing is read.
    """
    if start in ("$", "0", "-"):
        return "0-0" if start != "$" else "$"
    ms, _, n = start.partition("-") if isinstance(start, str) else ("", "", "")
    if not (ms.isdigit() and (n == "" or n.isdigit())):
        raise ConfigurationError(f"start must be '$', '0', '-' or a stream entry id '<ms>-<n>', not {start!r}")
    return start


class EventStream:
    """``set_events``/``events()`` of one queue."""

    def __init__(self, scripts: QueueScripts) -> None:
        self._scripts = scripts
        self._keys = scripts.keys

    def __repr__(self) -> str:
        return f"<EventStream {self._keys.event_stream!r}>"

    async def set_maxlen(self, maxlen: int | None) -> None:
        """Turn the stream on, capped near ``maxlen`` entries, or off (``None``: the stream is deleted).

        Raises:
            ConfigurationError: ``maxlen`` is not an int >= 1 (or ``None``); nothing is written.
        """
        argv = ("unevents",) if maxlen is None else ("events", count("maxlen", maxlen))
        await self._scripts.set_controls.resend(*argv, durable=True,
                                                what=f"set_events of {self._keys.destination!r}")

    async def last(self, n: int) -> list[QueueEvent]:
        """The last ``n`` events stored, newest last."""
        k = self._keys
        got = await call_idempotent(self._scripts.client, "XREVRANGE", k.event_stream, "+", "-", "COUNT", n,
                                    route=k.event_stream, what=f"events of {k.destination!r}",
                                    timeout_s=self._scripts.call_timeout_s)
        return [parse_event(i, f) for i, f in reversed(got)]

    async def page(self, after: str) -> list[QueueEvent]:
        """Up to :data:`PAGE` events stored after the entry id ``after`` (``"0-0"``: from the first)."""
        k = self._keys
        got = await call_idempotent(self._scripts.client, "XRANGE", k.event_stream, f"({after}", "+", "COUNT", PAGE,
                                    route=k.event_stream, what=f"events of {k.destination!r}",
                                    timeout_s=self._scripts.call_timeout_s)
        return [parse_event(i, f) for i, f in got]

    async def newest_id(self) -> str:
        """The id of the newest entry stored (``"0-0"`` when none): where ``start="$"`` begins."""
        last = await self.last(1)
        return last[0].id if last else "0-0"

    async def wait(self, after: str) -> list[QueueEvent]:
        """Events after ``after``, waiting up to :data:`BLOCK_MS` for one (``[]`` if none came)."""
        k, s = self._keys, self._scripts
        got = await call(s.client, "XREAD", "COUNT", PAGE, "BLOCK", BLOCK_MS, "STREAMS", k.event_stream, after,
                         route=k.event_stream, what=f"events of {k.destination!r}",
                         timeout_s=s.call_timeout_s + BLOCK_MS / 1000)
        if not got:
            return []
        entries = next(iter(got.values())) if isinstance(got, dict) else got[0][1]  # (RESP3: a map)
        return [parse_event(i, f) for i, f in entries]

    async def read(self, start: str, follow: bool, closed: Any) -> AsyncIterator[QueueEvent]:
        """The events after ``start`` (see :func:`check_start`); with ``follow``, then each new one as it
        comes until ``closed()`` (failures retried at the backoff's pace and logged, a permanent one
        raised); without, what is stored, then it stops."""
        after = check_start(start)
        if after == "$":
            after = await self.newest_id()
        backoff = Backoff(f"events of {self._keys.destination!r}")
        while not (follow and closed()):
            try:
                got = await (self.wait(after) if follow else self.page(after))
                backoff.succeeded()
            except BackendError as exc:
                if not follow or is_permanent(exc):
                    raise
                await asyncio.sleep(backoff.failed(exc))
                continue
            for event in got:
                after = event.id
                yield event
            if not follow and len(got) < PAGE:
                return
