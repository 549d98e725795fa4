"""The controls of a sharded queue: a pause, a rate limit or a concurrency limit goes to every shard's
controls hash.

A pause that failed part way leaves some shards paused: call it again (each call is idempotent). A rate of R
becomes R/K on each shard with a burst of ``ceil(burst / K)``, so items bunched on a few shards (one hot key)
come out slower than R. A concurrency limit of N becomes ``N // K`` per shard, the first ``N % K`` shards one
more: the shards hold at most N together, and messages bunched on a few shards wait for their shards' room.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from .._consuming.controls import MAX_GROUP_CONCURRENCY, Controls
from .._util.checks import count, positive
from .fanout import on_every

__all__ = ["ShardedControls"]


class ShardedControls:
    """``pause``/``resume``/``is_paused``/``set_rate_limit``/``set_concurrency_limit`` of a sharded
    queue object."""

    def __init__(self, shards: Sequence[Controls]) -> None:
        self._shards = shards

    def __repr__(self) -> str:
        return f"<ShardedControls shards={len(self._shards)}>"

    async def pause(self) -> None:
        """Pause every shard's consumers."""
        await on_every(self._shards, Controls.pause)

    async def resume(self) -> None:
        """Resume every shard's consumers."""
        await on_every(self._shards, Controls.resume)

    async def is_paused(self) -> bool:
        """Whether any shard is paused."""
        return any(await on_every(self._shards, Controls.is_paused))

    async def set_rate_limit(self, per_second: float | None, burst: int | None = None) -> None:
        """Limit the whole queue to ``per_second`` items a second (``None``: no limit), in bursts of
        ``burst`` (default: one second's worth): each shard gets ``per_second / K`` and a share of the
        burst.

        Raises:
            ConfigurationError: ``per_second`` is not a finite number above 0, or ``burst`` not an
                int >= 1; nothing is written.
        """
        k = len(self._shards)
        if per_second is None:
            if burst is not None:
                count("burst", burst)
            await on_every(self._shards, lambda controls: controls.set_rate_limit(None))
            return
        rate = positive("per_second", per_second)
        size = max(1, math.ceil(rate)) if burst is None else count("burst", burst)
        await on_every(self._shards, lambda controls: controls.set_rate_limit(rate / k, max(1, math.ceil(size / k))))

    async def set_concurrency_limit(self, limit: int | None) -> None:
        """Let the whole queue's reliable consumers hold at most ``limit`` messages at once (``None``:
        no limit), split over the shards (see the module docstring).

        Raises:
            ConfigurationError: ``limit`` is not an int >= the shard count (or ``None``); nothing is written.
        """
        k = len(self._shards)
        if limit is None:
            await on_every(self._shards, lambda controls: controls.set_concurrency_limit(None))
            return
        total = count("limit", limit, minimum=k)
        shares = [(controls, total // k + (i < total % k)) for i, controls in enumerate(self._shards)]
        await on_every(shares, lambda share: share[0].set_concurrency_limit(share[1]))

    async def set_group_concurrency(self, limit: int) -> None:
        """The group limit of every shard (a group lives in one shard: the limit is per group).

        Raises:
            ConfigurationError: ``limit`` is not an int from 1 to 1,000,000; nothing is written.
        """
        n = count("limit", limit, maximum=MAX_GROUP_CONCURRENCY)
        await on_every(self._shards, lambda controls: controls.set_group_concurrency(n))
