"""The dead letters of a sharded queue: each shard keeps its own list, so a requeued entry goes back to
the shard it died in and a keyed item stays in its key's shard."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from .._contents.dead_letters import DeadLetter, DeadLetters
from .._wire.delays import delay_to_ms
from ..exceptions import ConfigurationError
from .fanout import on_every

__all__ = ["ShardedDeadLetters"]


class ShardedDeadLetters:
    """``dead_letters``/``requeue_dead_letters``/``purge_dead_letters`` of a sharded queue object."""

    def __init__(self, shards: Sequence[DeadLetters]) -> None:
        self._shards = shards

    def __repr__(self) -> str:
        return f"<ShardedDeadLetters shards={len(self._shards)}>"

    async def _oldest(self, limit: int | None) -> list[tuple[int, DeadLetter[Any]]]:
        """The oldest ``limit`` entries of all shards (``None``: all), oldest first, with their shard."""
        lists = await on_every(self._shards, lambda letters: letters.read(limit))
        found = [(shard, letter) for shard, letters in enumerate(lists) for letter in letters]
        # Stable: a shard's own order kept; an entry without a time (an older release's) counts as oldest.
        found.sort(key=lambda pair: pair[1].dead_at_ms or 0)
        return found if limit is None else found[:limit]

    async def read(self, limit: int | None) -> list[DeadLetter[Any]]:
        """The oldest ``limit`` entries of all shards (``None``: all), oldest first."""
        _check_limit(limit)
        return [letter for _, letter in await self._oldest(limit)]

    async def requeue(self, limit: int | None, delay: float | timedelta) -> int:
        """Requeue every shard's entries (``None``), or the oldest ``limit`` of all shards: each shard
        requeues its oldest ones, as many as it has among them. Returns how many were requeued.

        Raises:
            ConfigurationError: a bad ``limit``. InvalidDelayError: a bad ``delay``. BackendError: a
                shard's call failed (the other shards' requeues may have been applied).
        """
        _check_limit(limit)
        delay_to_ms(delay)  # checked before any shard is touched
        if limit is None:
            return sum(await on_every(self._shards, lambda letters: letters.requeue(None, delay)))
        per_shard = Counter(shard for shard, _ in await self._oldest(limit))
        counts = await on_every(list(per_shard.items()),
                                lambda pair: self._shards[pair[0]].requeue(pair[1], delay))
        return sum(counts)

    async def purge(self) -> int:
        """Delete every shard's list; returns how many entries they had."""
        return sum(await on_every(self._shards, DeadLetters.purge))


def _check_limit(limit: object) -> None:
    if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 1):
        raise ConfigurationError(f"limit must be None or an int >= 1, got {limit!r}")
