"""Every byte layout the library writes or reads in Python (pure functions, no I/O).

Element kinds, one vocabulary in code, docs and errors (the Lua side of the same layouts is in
``aiodelayq/_scripts/lua/lib/``: ``parse.lua``, ``item.lua``, ``messages.lua``, ``dead.lua``):

========  ==========================================  =====================  =====================
kind      layout                                      where it is pending    who writes it
========  ==========================================  =====================  =====================
fast      ``Bc0Lc0``: 20, id, #payload, payload;      timeout zset only      aiodelayq (default)
          id = ``adq`` 0x01 | stamp (8, big-endian
          µs) | 8 random bytes
strict    ``Bc0Lc0``: 8, 8 random bytes, #payload,    zset + Redisson's      Redisson >= 3.21.1,
          payload                                     insertion-order list   ``strict=True``
legacy    ``dLc0``: random double, #payload, payload  zset + list            Redisson < 3.21.1,
                                                                             ``wire_format=
                                                                             "redisson-legacy"``
========  ==========================================  =====================  =====================

``L`` is the server's native unsigned long (8 bytes on 64-bit Linux servers, 4 on Windows builds),
read once per client with the NATIVE_LONG script, because Redisson's Lua packs with it.

A **message** (reliable consumption, in the in-flight zset) is ``adq`` 0x02 | 16-byte id | ``>I4``
delivery count | ``>d`` due ms of this delivery (0: a first delivery) | payload.

A **dead-letter entry** is ``adq`` 0x03 (the envelope, version 1) | ``>B`` reason | ``>I4`` delivery count |
``>d`` server ms when it died | the raw bytes (the payload, or a malformed element as it was found); reasons 1
max_deliveries, 2 undecodable, 3 malformed, 4 nacked, 5 expired (:func:`dead_reason`). Anything else in the
list reads as ``malformed``.

An **item envelope** (headers, expiry, schedule) takes the bare payload's place inside the element, so every
layout and Redisson's own transfer carry it unchanged: 0xC1 ``adq`` 0x04 | ``>d`` expiry, server epoch ms (0:
none) | ``>H`` headers block length | ``>H`` schedule key length (0: not recurring) | ``>I4`` occurrence
number | ``>B`` flags (1: list more cron times; 2: resync, not an item; 4: grouped) | headers (``>H`` key
length, key, ``>H`` value length, value, per header) | schedule key | for a grouped item ``>H`` group length,
group | payload. 0xC1 starts no UTF-8 text and no MessagePack value; another codec's payload starting with the
marker is wrapped in an empty envelope. ``lib/item.lua`` reads the same fixed offsets.

A **schedule record** (the schedules hash, by key) is laid out in ``lua/lib/recur.lua``;
:func:`parse_schedule` reads it.

A **tier entry** (``tier_after_s``; ``docs/design.md``, "Tiered pending") is an unkeyed fast element in a
bucket list ``aiodelayq_tier_<start>:{N}`` instead of the timeout zset: ``>H`` due time minus the bucket's
start (ms, below the width) | the element. A bucket holds the items due in ``[start, start + width)``;
``lua/lib/tiers.lua`` writes and reads them.
"""

from __future__ import annotations

import functools
import os
import secrets
import struct
import time
from collections.abc import Mapping
from typing import Literal, NamedTuple, cast

from ..exceptions import InvalidHeadersError

__all__ = ["ITEM_MAGIC", "ITEM_MARK", "MAX_HEADERS_BYTES", "MESSAGE_HEADER", "TIER_WIDTH_MS", "DeadReason",
           "ElementKind", "InsertionStamps", "ParsedDeadLetter", "ScheduleRecord", "Unwrapped", "classify_element",
           "dead_reason", "element_kind", "entry_key", "fragment_size", "grouped_payloads", "key_entry", "long_format",
           "offer_args", "pack_dead_letter", "pack_fragments", "pack_tier_entry", "pack_times", "parse_dead_letter",
           "parse_schedule", "requeue_ids", "tier_width_ms", "unpack_tier_entry"]

ElementKind = Literal["fast", "strict", "legacy"]

_FAST_HEADER = b"\x14adq\x01"  # id length 20, then the marker
_FRAME = struct.Struct(">dI")  # delay ms, element length: one frame of OFFER's 'fast' blob
_WINDOW = struct.Struct(">d")  # a keyed OFFER entry's deduplication window, ms
_MESSAGE_MAGIC = b"adq\x02"
MESSAGE_HEADER = struct.Struct(">I d")
"""A message element's delivery count and due ms of this delivery (0: unknown), at offset 20."""
_DEAD_MAGIC = b"adq\x03"
_DEAD_HEADER = struct.Struct(">B I d")  # reason, delivery count, dead at (server ms)
DeadReason = Literal["max_deliveries", "undecodable", "malformed", "nacked", "expired"]
_DEAD_REASONS: dict[int, DeadReason] = {1: "max_deliveries", 2: "undecodable", 3: "malformed", 4: "nacked",
                                        5: "expired"}

Fragment = tuple[int, bytes] | tuple[int, bytes | int, bytes]
"""One prepared item: fast ``(delay_ms, element)``; strict/legacy ``(delay_ms, id, payload)``."""


def element_kind(*, strict: bool, wire_format: str) -> ElementKind:
    """The kind a producer writes: ``wire_format="redisson-legacy"`` is always legacy (its layout has
    no room for the fast marker); otherwise ``strict`` picks strict over fast."""
    if wire_format == "redisson-legacy":
        return "legacy"
    return "strict" if strict else "fast"


class InsertionStamps:
    """Insertion stamps of fast elements: µs since the epoch, strictly increasing per instance (one per
    client), so ``read_all`` keeps a producer's order among items due in the same millisecond."""

    def __init__(self) -> None:
        self.last = 0

    def __repr__(self) -> str:
        return f"<InsertionStamps last={self.last}>"

    def reserve(self, count: int) -> int:
        """Reserve ``count`` consecutive stamps; returns the first."""
        first = max(self.last + 1, time.time_ns() // 1000)
        self.last = first + count - 1
        return first


def long_format(native_long: bytes) -> str:
    """The ``struct`` format of the server's ``L``, from the NATIVE_LONG reply (``pack('L', 1)``)."""
    return ("<" if native_long[0] == 1 else ">") + {4: "I", 8: "Q"}[len(native_long)]


@functools.lru_cache(maxsize=4)
def _long_struct(fmt: str) -> struct.Struct:
    return struct.Struct(fmt)


def classify_element(element: bytes, fmt: str) -> ElementKind | Literal["malformed"]:
    """The kind of a pending element (the table above) whose lengths add up under the server's native
    long ``fmt`` (:func:`long_format`), or ``malformed``."""
    size = _long_struct(fmt)

    def fits(head: int) -> bool:
        return (len(element) >= head + size.size
                and size.unpack_from(element, head)[0] == len(element) - head - size.size)

    if element.startswith(_FAST_HEADER) and fits(21):
        return "fast"
    if element[:1] == b"\x08" and fits(9):
        return "strict"
    return "legacy" if fits(8) else "malformed"


def pack_fragments(kind: ElementKind, items: list[tuple[int, bytes]], *, stamps: InsertionStamps,
                   long_fmt: str | None, tags: list[bytes | None] | None = None) -> list[Fragment]:
    """Turn ``(delay_ms, payload)`` pairs into OFFER fragments of ``kind`` (fast ones packed here,
    strict/legacy ones by the script). A keyed item's 8-byte ``tags`` entry replaces its random
    bytes, so a transfer finds its key index entry."""
    count = len(items)
    if kind == "fast":
        assert long_fmt is not None
        pack_len = _long_struct(long_fmt).pack
        ids = _fast_ids(stamps, count, tags)
        return [(delay_ms, b"".join((_FAST_HEADER, ids[i], pack_len(len(payload)), payload)))
                for i, (delay_ms, payload) in enumerate(items)]
    if kind == "strict":
        ids = _random_or_tags(count, tags)
        return [(delay_ms, ids[i], payload) for i, (delay_ms, payload) in enumerate(items)]
    # Legacy: a decimal long the script packs as the double; a keyed item's tag is those 8 bytes.
    legacy_ids: list[bytes | int] = [secrets.randbits(64) - 2**63 if tag is None else tag
                                     for tag in (tags if tags is not None else [None] * count)]
    return [(delay_ms, legacy_ids[i], payload) for i, (delay_ms, payload) in enumerate(items)]


def key_entry(raw_key: bytes, replace: bool, window_ms: int | None = None) -> bytes:
    """A keyed item's OFFER entry: its letter (``n`` keep a pending item of the key, ``r`` replace
    it; ``N``/``R`` the same with a deduplication window of ``window_ms``), the window, the key."""
    if window_ms is None:
        return (b"r" if replace else b"n") + raw_key
    return (b"R" if replace else b"N") + _WINDOW.pack(window_ms) + raw_key


def entry_key(entry: bytes) -> bytes:
    """The key (UTF-8) of a :func:`key_entry`."""
    return entry[1 + _WINDOW.size:] if entry[:1] in (b"N", b"R") else entry[1:]


def offer_args(kind: ElementKind | Literal["grouped"], fragments: list[Fragment], entries: list[bytes] | None = None,
               limit: str = "", tier_after_ms: int | None = None) -> list[bytes | int | str]:
    """OFFER's ARGV after the call id and the issue time (``lua/offer.lua``): key ``entries``
    (:func:`key_entry`; ``b""``: no key; ``None``: no keys), ``capacity`` ``limit`` (``""``: none),
    tier horizon ``tier_after_ms``; ``"grouped"``: fast elements, some of them grouped items."""
    keys = b"" if entries is None else (b"".join(e[:1] or b"-" for e in entries)
                                        + b"".join(_key_part(e) for e in entries if e))
    if kind in ("fast", "grouped"):
        fast = cast(list[tuple[int, bytes]], fragments)
        blob = b"".join(_FRAME.pack(delay_ms, len(element)) + element for delay_ms, element in fast)
        if tier_after_ms is None:
            return [kind, keys, limit, blob, len(fragments)]
        return [kind, keys, limit, blob, len(fragments), tier_after_ms, tier_width_ms(tier_after_ms)]
    args: list[bytes | int | str] = [kind, keys, limit]
    for fragment in fragments:
        args.extend(fragment)
    return args


def _key_part(entry: bytes) -> bytes:
    """An entry's part after the letters: the key, length-prefixed, then its window."""
    key, window = entry_key(entry), entry[1:1 + _WINDOW.size] if entry[:1] in (b"N", b"R") else b""
    return len(key).to_bytes(2, "big") + key + window


def fragment_size(fragment: Fragment) -> int:
    """Bytes a fragment adds to an OFFER call (the framing of fast elements included)."""
    if len(fragment) == 2:
        return _FRAME.size + len(fragment[1])
    return 24 + len(fragment[2])


# -- tier entries -----------------------------------------------------------------------------------
TIER_WIDTH_MS = 60_000
"""The widest tier bucket, ms; the ``>H`` offset of an entry fits it."""
_TIER_OFFSET = struct.Struct(">H")


def tier_width_ms(tier_after_ms: int) -> int:
    """The bucket width for the horizon ``tier_after_ms`` (ms, >= 1). A bucket is promoted one width
    before its start, so the width never exceeds the horizon: no item goes to an already promoted bucket."""
    return min(TIER_WIDTH_MS, tier_after_ms)


def pack_tier_entry(due_ms: int, start_ms: int, element: bytes) -> bytes:
    """The entry of ``element``, due at ``due_ms``, in the bucket that starts at ``start_ms``.

    Raises:
        struct.error: ``due_ms`` is not within 65,535 ms from ``start_ms``.
    """
    return _TIER_OFFSET.pack(due_ms - start_ms) + element


def unpack_tier_entry(entry: bytes, start_ms: int) -> tuple[int, bytes]:
    """``(due ms, element)`` of an entry of the bucket that starts at ``start_ms`` (a short one: due at the start)."""
    if len(entry) < _TIER_OFFSET.size:
        return start_ms, entry
    return start_ms + _TIER_OFFSET.unpack_from(entry)[0], entry[_TIER_OFFSET.size:]


def parse_messages(elements: list[bytes]) -> list[tuple[int, int | None, bytes]]:
    """(delivery count, due ms or ``None`` for a first delivery, payload) of each RECEIVE message
    (:func:`message_id` reads an id: most messages are settled without anyone asking for it).

    Raises:
        ValueError: one of them is not a message element.
    """
    unpack = MESSAGE_HEADER.unpack_from
    return [(count, int(due) if due else None, payload)
            for element, payload in zip(elements, message_payloads(elements), strict=True)
            for count, due in (unpack(element, 20),)]


def message_payloads(elements: list[bytes]) -> list[bytes]:
    """The stored payload of each RECEIVE message (see :func:`parse_messages`), for a caller that
    reads each one's :data:`MESSAGE_HEADER` as it makes its message.

    Raises:
        ValueError: one of them is not a message element.
    """
    magic = _MESSAGE_MAGIC
    for element in elements:
        if element[:4] != magic or len(element) < 32:
            raise ValueError("not a message element")
    return [element[32:] for element in elements]


def grouped_payloads(stored: list[bytes]) -> tuple[list[bytes], list[str | None]]:
    """The codec's payloads in ``stored`` (message payloads: bare, or envelopes that carry a group and
    nothing else), and each one's group (``None``: bare).

    Raises:
        ValueError: an envelope that carries more than a group (or is malformed).
    """
    payloads: list[bytes] = []
    groups: list[str | None] = []
    for data in stored:
        if data[:1] != ITEM_MARK:
            payloads.append(data)
            groups.append(None)
            continue
        alone = _group_alone(data)
        if alone is None:
            raise ValueError("an envelope that carries more than a group")
        payloads.append(alone[0])
        groups.append(alone[1])
    return payloads, groups


def _group_alone(data: bytes) -> tuple[bytes, str] | None:
    """The payload and group of an envelope ``data`` that carries a group and nothing else (the
    common grouped item); ``None`` for any other envelope, or a malformed one."""
    if len(data) < _GROUP_AT:
        return None
    expires_ms, block_len, key_len, _occurrence, flags, n = _FIXED_GROUP.unpack_from(data, len(ITEM_MAGIC))
    end = _GROUP_AT + n
    if flags != _GROUPED or block_len or key_len or expires_ms or not 0 < n <= len(data) - _GROUP_AT:
        return None
    try:
        return data[end:], data[_GROUP_AT:end].decode()
    except UnicodeDecodeError:
        return None


def _fast_ids(stamps: InsertionStamps, count: int, tags: list[bytes | None] | None = None) -> list[bytes]:
    """The 16 bytes after a fast element's marker, for ``count`` elements."""
    first = stamps.reserve(count)
    return [(first + i).to_bytes(8, "big") + own for i, own in enumerate(_random_or_tags(count, tags))]


_CLEAR_TOP_BIT = bytes(b & 0x7F for b in range(256))


def _random_or_tags(count: int, tags: list[bytes | None] | None) -> list[bytes]:
    """8 bytes per item: its key tag where ``tags`` has one, else random with the top bit clear (a
    key tag has it set: see ``_wire.item_keys.key_tag``)."""
    buffer = bytearray(os.urandom(8 * count))  # one syscall for the whole batch
    buffer[0::8] = buffer[0::8].translate(_CLEAR_TOP_BIT)
    randomness = bytes(buffer)
    own = [randomness[8 * i:8 * i + 8] for i in range(count)]
    return own if tags is None else [tag if tag is not None else mine for tag, mine in zip(tags, own, strict=True)]


def requeue_ids(stamps: InsertionStamps, count: int) -> bytes:
    """16 bytes per entry for REQUEUE (strict and legacy elements use the first 8)."""
    return b"".join(_fast_ids(stamps, count))


class ParsedDeadLetter(NamedTuple):
    """The fields of a dead-letter entry."""

    reason: DeadReason
    delivery_count: int | None
    dead_at_ms: int | None
    raw: bytes


def pack_dead_letter(raw: bytes, reason: DeadReason, delivery_count: int, dead_at_ms: int) -> bytes:
    """The dead-letter envelope of ``raw`` (the layout the scripts write, for tools and tests)."""
    code = next(code for code, name in _DEAD_REASONS.items() if name == reason)
    return _DEAD_MAGIC + _DEAD_HEADER.pack(code, delivery_count, dead_at_ms) + raw


def dead_reason(code: int) -> DeadReason:
    """The reason of a dead-letter reason number (``lua/lib/dead.lua``); an unknown one is ``malformed``."""
    return _DEAD_REASONS.get(code, "malformed")


def message_id(element: bytes) -> str:
    """The id (hex) of the message ``element``: the same for every delivery of one item."""
    return element[4:20].hex()


def parse_dead_letter(entry: bytes) -> ParsedDeadLetter:
    """Split a dead-letter entry into its fields; never fails (anything but an envelope is malformed)."""
    if entry[:4] == _DEAD_MAGIC and len(entry) >= 4 + _DEAD_HEADER.size and entry[4] in _DEAD_REASONS:
        code, count, dead_at = _DEAD_HEADER.unpack_from(entry, 4)
        return ParsedDeadLetter(_DEAD_REASONS[code], count, int(dead_at), entry[4 + _DEAD_HEADER.size:])
    return ParsedDeadLetter("malformed", None, None, entry)


# -- item envelopes --------------------------------------------------------------------------------
ITEM_MAGIC = b"\xc1adq\x04"
ITEM_MARK = ITEM_MAGIC[:1]
"""The first byte of an envelope: ``data[:1] != ITEM_MARK`` is the cheap test for a bare payload."""
# expiry ms, headers block length, schedule key length, occurrence number, flags (1: refill)
_FIXED = struct.Struct(">dHHIB")
_PREFIX = len(ITEM_MAGIC) + _FIXED.size
_LENGTH = struct.Struct(">H")

_GROUPED = 4  # the flag of an envelope that carries a group
# The fixed part and the group's length of an envelope that carries a group alone (no headers, no
# schedule key), read in one call; its group starts at _GROUP_AT.
_FIXED_GROUP = struct.Struct(_FIXED.format + "H")
_GROUP_AT = _PREFIX + _LENGTH.size

MAX_HEADERS_BYTES = 16_384
"""The largest headers block: keys and values in UTF-8, plus 4 bytes per header."""


class Unwrapped(NamedTuple):
    """What a stored payload holds (the envelope's fields; expiry in server epoch ms)."""

    payload: bytes
    headers: dict[str, str]
    expires_at_ms: int | None
    schedule_key: str | None = None
    occurrence: int = 0
    refill: bool = False
    resync: bool = False
    group: str | None = None


def pack_headers(headers: object, option: str = "headers") -> bytes:
    """The headers block of a mapping of ``str`` to ``str`` (``b""`` for ``None`` or an empty one).

    Raises:
        InvalidHeadersError: not a mapping, a key or value that is not a ``str`` (or not valid
            UTF-8), an empty key, or a block over ``MAX_HEADERS_BYTES``; ``option`` names the
            argument in the message.
    """
    if headers is None:
        return b""
    if not isinstance(headers, Mapping):
        raise InvalidHeadersError(f"{option} must be a mapping of str to str, not {type(headers).__name__}")
    parts: list[bytes] = []
    size = 0
    for key, value in headers.items():
        if not isinstance(key, str) or not key:
            raise InvalidHeadersError(f"{option}: every key must be a non-empty str, got {key!r}")
        if not isinstance(value, str):
            raise InvalidHeadersError(f"{option}[{key!r}] must be a str, not {type(value).__name__}")
        try:
            raw_key, raw_value = key.encode(), value.encode()
        except UnicodeEncodeError as exc:  # lone surrogates
            raise InvalidHeadersError(f"{option}[{key!r}] is not valid UTF-8: {exc}") from exc
        size += 4 + len(raw_key) + len(raw_value)
        if size > MAX_HEADERS_BYTES:
            raise InvalidHeadersError(f"{option} take more than {MAX_HEADERS_BYTES} bytes encoded")
        parts += [_LENGTH.pack(len(raw_key)), raw_key, _LENGTH.pack(len(raw_value)), raw_value]
    return b"".join(parts)


def wrap(payload: bytes, headers_block: bytes, expires_at_ms: int | None, schedule_key: bytes = b"",
         occurrence: int = 0, group: bytes = b"") -> bytes:
    """``payload`` in an envelope, or as it is when there is nothing to carry and it cannot be
    mistaken for an envelope. ``group``: a grouped item's group (UTF-8, checked by the caller)."""
    if (not headers_block and expires_at_ms is None and not schedule_key and not group
            and not payload.startswith(ITEM_MAGIC)):
        return payload
    fixed = _FIXED.pack(expires_at_ms or 0, len(headers_block), len(schedule_key), occurrence,
                        _GROUPED if group else 0)
    if group:
        return b"".join((ITEM_MAGIC, fixed, headers_block, schedule_key, _LENGTH.pack(len(group)), group, payload))
    return b"".join((ITEM_MAGIC, fixed, headers_block, schedule_key, payload))


def unwrap(data: bytes) -> Unwrapped:
    """What ``data`` holds: an envelope's parts, or ``data`` itself when it is no whole envelope."""
    if not data.startswith(ITEM_MAGIC) or len(data) < _PREFIX:
        return Unwrapped(data, {}, None)
    if (alone := _group_alone(data)) is not None:  # the common grouped item: read at once
        return Unwrapped(alone[0], {}, None, group=alone[1])
    expires_ms, block_len, key_len, occurrence, flags = _FIXED.unpack_from(data, len(ITEM_MAGIC))
    end = _PREFIX + block_len
    if end + key_len > len(data):
        return Unwrapped(data, {}, None)
    headers: dict[str, str] = {}
    pos = _PREFIX
    try:
        while pos < end:
            (n,) = _LENGTH.unpack_from(data, pos)
            key = data[pos + 2:pos + 2 + n].decode()
            pos += 2 + n
            (n,) = _LENGTH.unpack_from(data, pos)
            headers[key] = data[pos + 2:pos + 2 + n].decode()
            pos += 2 + n
        schedule_key = data[end:end + key_len].decode() if key_len else None
    except (struct.error, UnicodeDecodeError):
        return Unwrapped(data, {}, None)
    if pos != end:
        return Unwrapped(data, {}, None)
    start, group = end + key_len, None
    if flags & _GROUPED:
        try:
            (n,) = _LENGTH.unpack_from(data, start)
            group = data[start + 2:start + 2 + n].decode()
        except (struct.error, UnicodeDecodeError):
            return Unwrapped(data, {}, None)
        if not group or start + 2 + n > len(data):
            return Unwrapped(data, {}, None)
        start += 2 + n
    return Unwrapped(data[start:], headers, int(expires_ms) if expires_ms > 0 else None, schedule_key,
                     occurrence, bool(flags & 1), bool(flags & 2), group)


# -- schedules of recurring items -------------------------------------------------------------------
_RECORD = struct.Struct(">IBddH")  # occurrence number, stalled, every ms, anchor ms, index field length
_TIME = struct.Struct(">d")


class ScheduleRecord(NamedTuple):
    """A recurring item's record: period ``every_ms`` (0 for cron), cron ``spec`` (``expression\ntime
    zone``), listed cron ``times_ms`` (epoch ms, ascending); ``stalled``: its cron times ran out."""

    occurrence: int
    stalled: bool
    every_ms: int
    spec: str
    times_ms: list[int]


def parse_schedule(record: bytes) -> ScheduleRecord:
    """The fields of a schedule record.

    Raises:
        ValueError: not a schedule record.
    """
    try:
        occurrence, stalled, every_ms, _anchor, field_len = _RECORD.unpack_from(record)
        pos = _RECORD.size + field_len + 8
        (spec_len,) = _LENGTH.unpack_from(record, pos)
        spec = record[pos + 2:pos + 2 + spec_len].decode()
        rest = record[pos + 2 + spec_len:]
    except (struct.error, UnicodeDecodeError) as exc:
        raise ValueError(f"not a schedule record: {exc}") from exc
    times = [int(t) for (t,) in _TIME.iter_unpack(rest[:len(rest) - len(rest) % 8])]
    return ScheduleRecord(occurrence, bool(stalled), int(every_ms), spec, times)


def pack_times(times_ms: list[int]) -> bytes:
    """Cron due times (epoch ms, ascending) as the scripts read them."""
    return b"".join(_TIME.pack(t) for t in times_ms)
