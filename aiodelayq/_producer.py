"""Producing: validate, encode and pack items, then add them with the OFFER script.

Offers carry a call id (16 random bytes) that OFFER remembers for 60 s: after a lost reply the
producer resends the same call within ``call_timeout_s`` and the server applies it once. Calls are
capped by count and by bytes, so one large item never fails small ones sent with it.
"""

from __future__ import annotations

import asyncio
import functools
import os
import secrets
import struct
import time
import weakref
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from redis.asyncio import Redis

from ._batcher import OfferBatcher
from ._codec import Codec, encode_item
from ._connections import run_script
from ._delays import delay_to_ms
from ._keys import QueueKeys
from ._retry import resend_within
from ._scripts import NATIVE_LONG, OFFER

__all__ = ["MAX_CALL_ITEMS", "Producer"]

MAX_CALL_ITEMS = 1000  # items per OFFER call: a few ms of server time at most

# Fast elements: 20-byte id = marker | insertion stamp | 8 random bytes (see _scripts.py).
_FAST_HEADER = b"\x14adq\x01"  # id length 20, then the marker
_FRAME = struct.Struct(">dI")  # delay ms, element length: one frame of the OFFER script's blob


@functools.lru_cache(maxsize=4)
def _long_struct(fmt: str) -> struct.Struct:
    return struct.Struct(fmt)


class _Stamps:
    """Insertion stamps: µs since the epoch, strictly increasing within this process."""

    last = 0

    @classmethod
    def reserve(cls, count: int) -> int:
        """Reserve ``count`` consecutive stamps; returns the first."""
        first = max(cls.last + 1, time.time_ns() // 1000)
        cls.last = first + count - 1
        return first


# The server's native 'L' layout, asked once per client (values are str: the client stays collectable).
_long_formats: weakref.WeakKeyDictionary[Redis, str] = weakref.WeakKeyDictionary()
_long_format_asks: weakref.WeakKeyDictionary[Redis, asyncio.Future[str]] = weakref.WeakKeyDictionary()


class Producer:
    """``offer``/``offer_many`` of one queue object (see :class:`~aiodelayq.DelayedQueue`)."""

    def __init__(self, client: Redis, keys: QueueKeys, codec: Codec, *, kind: str, call_timeout_s: float,
                 max_call_bytes: int) -> None:
        self._client = client
        self._keys = keys
        self._codec = codec
        self._kind = kind  # 'fast', 'current' (strict) or 'legacy'
        self._call_timeout_s = call_timeout_s
        self._max_call_bytes = max_call_bytes
        self._batcher: OfferBatcher | None = None

    def __repr__(self) -> str:
        return f"<Producer {self._keys.destination!r} kind={self._kind}>"

    def rebind(self) -> None:
        """Forget the batcher of a previous event loop."""
        self._batcher = None

    async def offer(self, item: Any, delay: float | timedelta) -> int:
        """One item through the batcher; returns its due time (epoch ms, server clock)."""
        [fragment] = await self.prepare([(item, delay)])
        if self._batcher is None:
            self._batcher = OfferBatcher(self._send, max_items=MAX_CALL_ITEMS, max_bytes=self._max_call_bytes,
                                         size=_fragment_size)
        return await self._batcher.submit(fragment)

    async def offer_many(self, pairs: Sequence[tuple[Any, float | timedelta]]) -> list[int]:
        """Many items, in calls of at most ``MAX_CALL_ITEMS`` items and ``max_call_bytes`` bytes, all
        sent at once; returns due times in input order."""
        fragments = await self.prepare(pairs)
        chunks: list[list[list[Any]]] = [[]]
        size = 0
        for fragment in fragments:
            fragment_size = _fragment_size(fragment)
            if chunks[-1] and (len(chunks[-1]) >= MAX_CALL_ITEMS or size + fragment_size > self._max_call_bytes):
                chunks.append([])
                size = 0
            chunks[-1].append(fragment)
            size += fragment_size
        if len(chunks) == 1:
            return await self._send(chunks[0])
        dues: list[int] = []
        for chunk_dues in await asyncio.gather(*(self._send(chunk) for chunk in chunks)):
            dues.extend(chunk_dues)
        return dues

    async def prepare(self, pairs: Sequence[tuple[Any, float | timedelta]]) -> list[list[Any]]:
        """Validate, encode and (fast kind) pack every pair; raises before anything is sent.

        Returns one argument fragment per item whose first element is its delay in ms: fast
        ``[delay_ms, element]``, strict ``[delay_ms, id, payload]`` (packed by the script).

        Raises:
            InvalidDelayError, EncodeError: bad input (nothing is sent).
            BackendError: the server's long layout could not be read.
        """
        codec = self._codec
        if self._kind == "fast":
            # Packed here with the server's own 'L' layout, so the script only has to ZADD them.
            pack_len = _long_struct(await self._native_long_format()).pack
            randomness = os.urandom(8 * len(pairs))  # one syscall for the whole batch
            first = _Stamps.reserve(len(pairs))
            fragments = []
            for i, (item, delay) in enumerate(pairs):
                delay_ms = delay_to_ms(delay)
                payload = encode_item(codec, item)
                element = b"".join((_FAST_HEADER, (first + i).to_bytes(8, "big"), randomness[8 * i:8 * i + 8],
                                    pack_len(len(payload)), payload))
                fragments.append([delay_ms, element])
            return fragments
        if self._kind == "current":
            return [[delay_to_ms(d), os.urandom(8), encode_item(codec, item)] for item, d in pairs]
        return [[delay_to_ms(d), secrets.randbits(64) - 2**63, encode_item(codec, item)] for item, d in pairs]

    async def _send(self, fragments: list[list[Any]]) -> list[int]:
        """One OFFER call (resent with the same call id after a lost reply, within the bound)."""
        k = self._keys
        keys = [k.destination, k.timeout_set, k.delay_list, k.channel, k.calls, k.call_replies]
        call_id = os.urandom(16)
        if self._kind == "fast":
            blob = b"".join(_FRAME.pack(d, len(e)) + e for d, e in fragments)
            args: list[Any] = [call_id, "packed", blob, len(fragments)]
        else:
            args = [call_id, self._kind]
            for fragment in fragments:
                args.extend(fragment)
        reply = await resend_within(
            lambda remaining_s, _resend: run_script(self._client, OFFER, keys, args, timeout_s=remaining_s,
                                                    what=f"offer to {k.destination!r}"),
            timeout_s=self._call_timeout_s)
        now = int(reply[0])
        return [now + int(fragment[0]) for fragment in fragments]

    async def _native_long_format(self) -> str:
        """``struct`` format of the server's native unsigned long (``L`` inside its Lua), asked once per
        client; concurrent first callers share one request (shielded: one caller's cancellation does
        not fail the others)."""
        client = self._client
        fmt = _long_formats.get(client)
        if fmt is not None:
            return fmt
        ask = _long_format_asks.get(client)
        if ask is None or (ask.done() and (ask.cancelled() or ask.exception() is not None)):
            ask = _long_format_asks[client] = asyncio.ensure_future(
                _ask_native_long(client, self._call_timeout_s))
        return await asyncio.shield(ask)


async def _ask_native_long(client: Redis, timeout_s: float) -> str:
    one: bytes = await run_script(client, NATIVE_LONG, [], [], timeout_s=timeout_s, what="read the server's long size")
    fmt = _long_formats[client] = ("<" if one[0] == 1 else ">") + {4: "I", 8: "Q"}[len(one)]
    return fmt


def _fragment_size(fragment: list[Any]) -> int:
    """Bytes a prepared item adds to a call (the framing of fast elements included)."""
    if len(fragment) == 2:
        return _FRAME.size + len(fragment[1])
    return 24 + len(fragment[2])
