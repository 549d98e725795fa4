"""Where the shards of a sharded queue live: each shard's queue name, and the record that fixes them.

A shard is an ordinary queue (:class:`~.key_names.QueueKeys`); its name's hash tag decides its slot.

- ``spaced`` (recorded by this release): shard ``i`` of ``N`` is ``{N~n}:i``, ``n`` the least integer
  whose tag's slot lies in the middle half of the i-th of K equal slot ranges, so with K a multiple of
  the P primaries of a default slot map each holds K / P shards (the middle half keeps clear of the
  ranges' rounding).
- ``hashed``: shard ``i`` is ``{N:i}``, wherever CRC16 puts it (uneven for small K).

The record is the ``shards`` field of the controls hash: ``K spaced``, or ``K`` (hashed). A release
that reads only a count refuses ``K spaced`` (no number), so it never writes where consumers do not look.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Literal

from redis.crc import REDIS_CLUSTER_HASH_SLOTS, key_slot

from .key_names import prefix_name

__all__ = ["Placement", "ShardRecord", "shard_name_parts", "shard_names"]

Placement = Literal["spaced", "hashed"]

_SLOTS = REDIS_CLUSTER_HASH_SLOTS
# Never reached (about 2 K ln K tags are tried), but a bug must not loop forever.
_MAX_TAGS = 10_000_000

_SPACED = re.compile(r"\{([^{}]+)~(0|[1-9][0-9]*)\}:(0|[1-9][0-9]*)")
_HASHED = re.compile(r"([^{}]+):(0|[1-9][0-9]*)")


def shard_names(name: str, shards: int, placement: Placement = "spaced") -> tuple[str, ...]:
    """The queue names of the ``shards`` shards of ``name``, in shard order.

    Raises:
        ValueError: ``name`` has a brace (a sharded queue's name has none: its own tag would be every
            shard's).
    """
    if "{" in name or "}" in name:
        raise ValueError(f"a sharded queue's name has no brace: {name!r}")
    if placement == "hashed":
        return tuple(f"{{{name}:{index}}}" for index in range(shards))
    return _spaced(name, shards)


@functools.lru_cache(maxsize=256)
def _spaced(name: str, shards: int) -> tuple[str, ...]:
    """One pass over the tags ``name~0``, ``name~1``, ...: the first in each range's middle half wins."""
    salts: list[int | None] = [None] * shards
    missing = shards
    for salt in range(_MAX_TAGS):
        index, offset = divmod(key_slot(f"{{{name}~{salt}}}".encode()) * shards, _SLOTS)
        if _SLOTS // 4 <= offset < _SLOTS * 3 // 4 and salts[index] is None:
            salts[index] = salt
            missing -= 1
            if not missing:
                return tuple(f"{{{name}~{salt}}}:{index}" for index, salt in enumerate(salts))
    raise RuntimeError(f"no spaced placement of {shards} shards found for {name!r}")  # pragma: no cover


def shard_name_parts(name: str) -> tuple[str, int] | None:
    """``(sharded queue name, shard index)`` if ``name`` has a shard's form (``{orders~5}:2``,
    ``{orders:2}``, ``orders:2``), else ``None``; only the record says whether it is one
    (:meth:`ShardRecord.index_of`)."""
    found = _SPACED.fullmatch(name)
    if found is not None:
        return found[1], int(found[3])
    found = _HASHED.fullmatch(name[1:-1] if name.startswith("{") and name.endswith("}") else name)
    if found is not None:
        return found[1], int(found[2])
    return None


@dataclass(frozen=True)
class ShardRecord:
    """What the name of a queue records about its shards.

    Attributes:
        count: the shard count (1: an ordinary queue, or nothing recorded).
        placement: where the shards are (``spaced`` for a name recorded by this release).
    """

    count: int
    placement: Placement = "spaced"

    @classmethod
    def parse(cls, raw: object) -> ShardRecord | None:
        """The record of the ``shards`` field's value ``raw`` (``None``: no field, count 1), or ``None``
        for a value this release cannot read."""
        if raw is None:
            return cls(1, "hashed")
        text = raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)
        count, _, word = text.partition(" ")
        if not count.isdigit() or int(count) < 1:
            return None
        if not word:
            return cls(int(count), "hashed")
        return cls(int(count), "spaced") if word == "spaced" else None

    @property
    def value(self) -> str:
        """The field's value that records this (``6 spaced``; ``6`` for a hashed placement)."""
        return f"{self.count} spaced" if self.placement == "spaced" else str(self.count)

    def names(self, name: str) -> tuple[str, ...]:
        """The queue names of the shards of ``name`` (``(name,)`` for an ordinary queue)."""
        return shard_names(name, self.count, self.placement) if self.count > 1 else (name,)

    def index_of(self, base: str, name: str) -> int | None:
        """The index of ``base``'s shard that ``name`` is, compared by prefixed keys, or ``None``."""
        if self.count < 2:
            return None
        wanted = prefix_name("p", name)
        return next((index for index, shard in enumerate(self.names(base)) if prefix_name("p", shard) == wanted), None)
