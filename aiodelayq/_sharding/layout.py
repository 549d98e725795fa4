"""Where an item of a sharded queue goes: a keyed item to shard ``crc32(key) % K`` (as
``java.util.zip.CRC32`` computes it), so every call about the key touches one shard; an unkeyed item to the
next shard of its producer's rotation, which starts at random so producers spread without coordinating."""

from __future__ import annotations

import random
import zlib

from .._util.checks import count
from ..exceptions import InvalidNameError

__all__ = ["MAX_SHARDS", "Rotation", "check_shards", "shard_of"]

# Each shard is a transfer task and a subscribed channel per consuming process.
MAX_SHARDS = 1024


def check_shards(shards: object, name: str) -> int:
    """``shards`` as a shard count for the queue ``name``.

    Raises:
        ConfigurationError: ``shards`` is not an ``int`` from 1 to :data:`MAX_SHARDS`.
        InvalidNameError: a sharded queue's name with a brace (its shards' keys would all take the
            tag the name's braces make, hence one slot).
    """
    result = count("shards", shards, minimum=1, maximum=MAX_SHARDS)
    if result > 1 and isinstance(name, str) and ("{" in name or "}" in name):
        raise InvalidNameError("the name of a sharded queue must not contain '{' or '}' (each shard's keys take a "
                               f"hash tag of their own, in different slots, only without them): {name!r}")
    return result


def shard_of(raw_key: bytes, shards: int) -> int:
    """The shard of the key whose UTF-8 bytes are ``raw_key``."""
    return zlib.crc32(raw_key) % shards


class Rotation:
    """Shard indexes ``0 .. size-1`` in turn, from a random start."""

    def __init__(self, size: int, rng: random.Random | None = None) -> None:
        self.size = size
        self._next = (rng or random.Random()).randrange(size)

    def __repr__(self) -> str:
        return f"<Rotation size={self.size} next={self._next}>"

    def next(self) -> int:
        """The next index."""
        index = self._next
        self._next = (index + 1) % self.size
        return index

    def order(self) -> list[int]:
        """Every index once, starting at :meth:`next`'s."""
        start = self.next()
        return [(start + offset) % self.size for offset in range(self.size)]
