"""Every byte layout the library writes or reads in Python (pure functions, no I/O).

Element kinds, one vocabulary in code, docs and errors (the Lua side of the same layouts is
``aiodelayq/_scripts/prelude.py``):

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
"""

from __future__ import annotations

import functools
import os
import secrets
import struct
import time
from typing import Literal, NamedTuple, cast

__all__ = [
    "ElementKind",
    "InsertionStamps",
    "ParsedMessage",
    "element_kind",
    "fragment_size",
    "long_format",
    "offer_args",
    "pack_fragments",
    "parse_message",
]

ElementKind = Literal["fast", "strict", "legacy"]

_FAST_HEADER = b"\x14adq\x01"  # id length 20, then the marker
_FRAME = struct.Struct(">dI")  # delay ms, element length: one frame of OFFER's 'fast' blob
_MESSAGE_MAGIC = b"adq\x02"
_MESSAGE_HEADER = struct.Struct(">I d")  # delivery count, due ms of this delivery (0: unknown)

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


def pack_fragments(kind: ElementKind, items: list[tuple[int, bytes]], *, stamps: InsertionStamps,
                   long_fmt: str | None) -> list[Fragment]:
    """Turn ``(delay_ms, payload)`` pairs into OFFER fragments of ``kind``. Fast elements are packed
    here with the server's ``long_fmt`` (so the script only ``ZADD``s them); strict and legacy ones
    get their id here and are packed by the script."""
    if kind == "fast":
        assert long_fmt is not None
        pack_len = _long_struct(long_fmt).pack
        randomness = os.urandom(8 * len(items))  # one syscall for the whole batch
        first = stamps.reserve(len(items))
        return [(delay_ms, b"".join((_FAST_HEADER, (first + i).to_bytes(8, "big"), randomness[8 * i:8 * i + 8],
                                     pack_len(len(payload)), payload)))
                for i, (delay_ms, payload) in enumerate(items)]
    if kind == "strict":
        return [(delay_ms, os.urandom(8), payload) for delay_ms, payload in items]
    return [(delay_ms, secrets.randbits(64) - 2**63, payload) for delay_ms, payload in items]


def offer_args(kind: ElementKind, fragments: list[Fragment]) -> list[bytes | int | str]:
    """OFFER's ARGV after the call id, for ``fragments`` of ``kind`` (see ``_scripts/producer.py``)."""
    if kind == "fast":
        fast = cast(list[tuple[int, bytes]], fragments)
        blob = b"".join(_FRAME.pack(delay_ms, len(element)) + element for delay_ms, element in fast)
        return ["fast", blob, len(fragments)]
    args: list[bytes | int | str] = [kind]
    for fragment in fragments:
        args.extend(fragment)
    return args


def fragment_size(fragment: Fragment) -> int:
    """Bytes a fragment adds to an OFFER call (the framing of fast elements included)."""
    if len(fragment) == 2:
        return _FRAME.size + len(fragment[1])
    return 24 + len(fragment[2])


class ParsedMessage(NamedTuple):
    """The fields of a message element."""

    id: str  # hex, stable across redeliveries
    delivery_count: int
    due_ms: int | None  # None for a first delivery
    payload: bytes


def parse_message(element: bytes) -> ParsedMessage:
    """Split a message element into its fields.

    Raises:
        ValueError: ``element`` is not a message element.
    """
    if element[:4] != _MESSAGE_MAGIC or len(element) < 32:
        raise ValueError("not a message element")
    count, due = _MESSAGE_HEADER.unpack_from(element, 20)
    return ParsedMessage(element[4:20].hex(), count, int(due) if due else None, element[32:])
