"""One atomic read of every key of a queue, decoded: what the model's checks compare with.

:func:`snapshot` reads the queue's keys in one ``MULTI``/``EXEC`` on a direct connection (never
through a fault proxy), with the server's ``TIME`` of that same instant, and decodes every element
into a :class:`Seen`: where it is (pending, ready, hand-off, in flight, dead) and what it carries
(the payload, headers, expiry, the schedule and occurrence of a recurring item, a message's id,
delivery count and deadline, a dead letter's reason). The layouts are the library's own
(``aiodelayq/_wire/elements.py``, ``docs/design.md``); this module only reads them.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Literal

from redis.asyncio import Redis

from aiodelayq import QueueEvent, QueueKeys
from aiodelayq._contents.event_stream import parse_event
from aiodelayq._wire.elements import message_id, parse_dead_letter, parse_messages, unwrap
from tests.helpers import handoff_payloads, unpack_list

__all__ = ["GROUPS", "Record", "Seen", "Snapshot", "Where", "snapshot"]

GROUPS = ("g0", "g1")  # the groups the model offers in (their lists are read by name)

Where = Literal["pending", "ready", "handoff", "in_flight", "dead"]

_FAST = b"\x14adq\x01"
_LONG = struct.Struct("<Q")  # the server's native unsigned long: 64-bit little-endian (the test servers)
_RECORD = struct.Struct(">IBddH")  # a schedule record's head (lua/lib/recur.lua)


@dataclass(frozen=True)
class Seen:
    """One element found in one of the queue's keys."""

    where: Where
    value: str  # the codec's payload, decoded (the model's queues use codec="str")
    headers: dict[str, str] = field(default_factory=dict)
    expires_at_ms: int | None = None
    schedule_key: str | None = None  # an occurrence of a recurring item: its schedule's key
    occurrence: int = 0  # ... and its number
    score: int | None = None  # pending: the due time; in flight: the visibility deadline (server ms)
    key: str | None = None  # pending: the key the key index gives this very element
    message_id: str | None = None  # in flight
    delivery_count: int | None = None  # in flight, dead
    reason: str | None = None  # dead
    element: bytes = b""  # pending: the element as stored
    group: str | None = None  # the group it was offered in (ready: its group's list, not the destination)

    def describe(self) -> str:
        parts = [self.where, repr(self.value)]
        if self.schedule_key is not None:
            parts.append(f"occurrence {self.occurrence} of {self.schedule_key!r}")
        for name in ("score", "key", "message_id", "delivery_count", "reason", "expires_at_ms"):
            if getattr(self, name) is not None:
                parts.append(f"{name}={getattr(self, name)!r}")
        if self.headers:
            parts.append(f"headers={self.headers!r}")
        if self.group is not None:
            parts.append(f"group={self.group!r}")
        return " ".join(parts)


@dataclass(frozen=True)
class Record:
    """A schedule's record (the schedules hash, by key)."""

    occurrence: int
    every_ms: int
    anchor_ms: int


@dataclass
class Snapshot:
    """Everything a queue holds at one instant of the server's clock (``now_ms``)."""

    now_ms: int
    seen: list[Seen]
    records: dict[str, Record]
    index: dict[bytes, str]  # pending element -> key, from the key index
    stale_index: list[str]  # keys whose indexed element is not pending
    paused: bool
    handoff_entries: int  # hand-off fields, tombstones included
    delay_list: int  # Redisson's insertion-order list (the model's queues write fast elements only)
    cap: int | None = None  # the concurrency limit
    held: int = 0  # messages the concurrency limit counts: in flight before their deadline, not waiting out a nack
    group_lists: dict[str, int] = field(default_factory=dict)  # each group's due items (its list's length)
    groups_hash: dict[str, int] = field(default_factory=dict)  # group -> admitted (+ 2**20: some may wait); "": waiting
    group_ready: dict[str, int] = field(default_factory=dict)  # each group's admitted items in the ready list
    group_limit: int = 1
    ready_in_destination: int = 0  # of the ready ones, in the destination list (the rest: the groups')
    windows: dict[str, tuple[int, int]] = field(default_factory=dict)  # key -> (window end, due) as stored
    events: list[QueueEvent] | None = None  # the event stream, oldest first (None: no stream key)

    def open_windows(self) -> dict[str, tuple[int, int]]:
        """The deduplication windows open at ``now_ms`` (the others wait to be trimmed)."""
        return {key: w for key, w in self.windows.items() if w[0] > self.now_ms}

    def at(self, where: Where) -> list[Seen]:
        return [s for s in self.seen if s.where == where]

    def describe(self) -> str:
        lines = [f"server time {self.now_ms}, paused={self.paused}, concurrency limit={self.cap} (held "
                 f"{self.held}), schedules={self.records}, group limit {self.group_limit}, waiting "
                 f"{self.groups_hash}, admitted and ready {self.group_ready}"]
        lines += [f"  {s.describe()}" for s in self.seen]
        return "\n".join(lines)


def _payload_of_element(element: bytes) -> bytes:
    """The payload of a fast element (``Bc0Lc0``: 20, the 20-byte id, the length, the payload)."""
    if element[:5] != _FAST or len(element) < 29:
        raise AssertionError(f"a pending element that is not a fast element: {element[:40]!r}")
    (length,) = _LONG.unpack_from(element, 21)
    if length != len(element) - 29:
        raise AssertionError(f"a fast element whose length field is wrong: {element[:40]!r}")
    return element[29:]


def _seen(where: Where, stored: bytes, **extra: object) -> Seen:
    item = unwrap(stored)
    return Seen(where, item.payload.decode(), item.headers, item.expires_at_ms, item.schedule_key, item.occurrence,
                group=item.group, **extra)  # type: ignore[arg-type]


async def snapshot(admin: Redis, keys: QueueKeys) -> Snapshot:
    """Read and decode every key of the queue ``keys`` in one transaction on ``admin``."""
    async with admin.pipeline(transaction=True) as pipe:
        pipe.zrange(keys.timeout_set, 0, -1, withscores=True)
        pipe.lrange(keys.destination, 0, -1)
        pipe.hgetall(keys.handoff)
        pipe.zrange(keys.in_flight, 0, -1, withscores=True)
        pipe.lrange(keys.dead_letter, 0, -1)
        pipe.hgetall(keys.key_index)
        pipe.hgetall(keys.schedules)
        pipe.hget(keys.controls, "paused")
        pipe.llen(keys.delay_list)
        pipe.hget(keys.controls, "cap")
        pipe.zrange(keys.nacked, 0, -1, withscores=True)
        pipe.zrange(keys.grouped, 0, -1, withscores=True)
        for group in GROUPS:
            pipe.lrange(keys.group_list(group), 0, -1)
        pipe.hgetall(keys.groups)
        pipe.lrange(keys.group_ready, 0, -1)
        pipe.hget(keys.controls, "group_limit")
        pipe.zrange(keys.dedupe_windows, 0, -1, withscores=True)
        pipe.hgetall(keys.dedupe_dues)
        pipe.exists(keys.event_stream)
        pipe.xrange(keys.event_stream)
        pipe.time()
        (pending, ready, handoff, in_flight, dead, index_hash, schedules, paused, delay_list, cap, nacked, grouped,
         *lists, groups_hash, admitted, group_limit, window_ends, window_dues, streamed, stream,
         (secs, micros)) = await pipe.execute()
    if {key for key, _ in window_ends} != set(window_dues):
        raise AssertionError(f"the windows' ends {window_ends} and due times {window_dues} name other keys")
    now_ms = int(secs) * 1000 + int(micros) // 1000
    index: dict[bytes, str] = {}
    for field_name, blob in index_hash.items():
        if field_name == b"overflow" or blob[:1] != b"\x01":
            continue
        key_bytes, element = unpack_list(blob[1:])
        index[element] = key_bytes.decode()
    pending = [*pending, *grouped]
    pending_elements = {element for element, _score in pending}
    stale = sorted(k for e, k in index.items() if e not in pending_elements)
    seen: list[Seen] = []
    for element, score in pending:
        seen.append(_seen("pending", _payload_of_element(element), score=int(score), key=index.get(element),
                          element=element))
    seen += [_seen("ready", payload) for payload in ready]
    ready_groups: dict[str, int] = {}
    for payload in admitted:
        seen.append(_seen("ready", payload))
        group = seen[-1].group
        if group is not None:
            ready_groups[group] = ready_groups.get(group, 0) + 1
    for payloads in lists:
        seen += [_seen("ready", payload) for payload in payloads]
    for blob in handoff.values():
        seen += [_seen("handoff", payload) for payload in handoff_payloads(blob)]
    elements = [element for element, _score in in_flight]
    for (count, _due, payload), (element, deadline) in zip(parse_messages(elements), in_flight, strict=True):
        seen.append(_seen("in_flight", payload, score=int(deadline), message_id=message_id(element),
                          delivery_count=count))
    for entry in dead:
        letter = parse_dead_letter(entry)
        seen.append(_seen("dead", letter.raw, reason=letter.reason, delivery_count=letter.delivery_count))
    records = {}
    for key, record in schedules.items():
        occurrence, _stalled, every_ms, anchor_ms, _field_len = _RECORD.unpack_from(record)
        records[key.decode()] = Record(occurrence, int(every_ms), int(anchor_ms))
    waiting = {element for element, due in nacked if due > now_ms}
    held = sum(1 for element, deadline in in_flight if deadline > now_ms and element not in waiting)
    return Snapshot(now_ms, seen, records, index, stale, paused is not None, len(handoff),
                    delay_list, None if cap is None else int(cap), held,
                    {group: len(payloads) for group, payloads in zip(GROUPS, lists, strict=True)},
                    {k.decode(): int(v) for k, v in groups_hash.items() if len(k) <= 256},  # (not the hash-table field)
                    ready_groups, int(group_limit or 1), len(ready),
                    {key.decode(): (int(end), int(window_dues[key])) for key, end in window_ends},
                    [parse_event(i, [x for pair in fields.items() for x in pair]) for i, fields in stream]
                    if streamed else None)
