"""The shards of one sharded queue object: K ordinary queues' components, placed as its name records.

Shards start placed as a new name's (``spaced``, ``_wire/placement.py``), so ``shard_keys`` answers at once;
the shard count check (:mod:`.record`) re-places them as recorded before any call reaches a shard. The
composites therefore hold views (:meth:`ShardSet.of`) that read the current shards at each use.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar, overload

from .._parts.queue_parts import QueueParts
from .._wire.key_names import QueueKeys
from .._wire.placement import Placement, shard_names

__all__ = ["ShardSet"]

C = TypeVar("C")


class ShardSet:
    """The shards of the sharded queue ``name``: ``build(shard_name)`` makes one shard's components."""

    def __init__(self, name: str, count: int, build: Callable[[str], QueueParts]) -> None:
        self._name = name
        self.count = count
        self._build = build
        self.placement: Placement = "spaced"
        self.parts = self._place(self.placement)

    def __repr__(self) -> str:
        return f"<ShardSet {self._name!r} shards={self.count} {self.placement}>"

    def _place(self, placement: Placement) -> tuple[QueueParts, ...]:
        return tuple(self._build(name) for name in shard_names(self._name, self.count, placement))

    def place(self, placement: Placement) -> None:
        """Place the shards as ``placement`` says (the name's record), before any of them is used;
        a no-op when they are placed so."""
        if placement != self.placement:
            self.parts = self._place(placement)
            self.placement = placement

    def keys(self) -> tuple[QueueKeys, ...]:
        """Each shard's keys, in shard order."""
        return tuple(p.keys for p in self.parts)

    def of(self, component: Callable[[QueueParts], C]) -> Sequence[C]:
        """A view of one component of every shard (``lambda p: p.producer``), in shard order, that
        reads the shards placed at each use."""
        return _Components(self, component)


class _Components(Sequence[C]):
    """One component of each of a :class:`ShardSet`'s current shards."""

    def __init__(self, shards: ShardSet, component: Callable[[QueueParts], C]) -> None:
        self._shards = shards
        self._component = component

    def __repr__(self) -> str:
        return f"<components of {self._shards!r}>"

    def __len__(self) -> int:
        return self._shards.count

    @overload
    def __getitem__(self, index: int) -> C: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[C]: ...

    def __getitem__(self, index: int | slice) -> C | Sequence[C]:
        if isinstance(index, slice):
            return [self._component(p) for p in self._shards.parts[index]]
        return self._component(self._shards.parts[index])
