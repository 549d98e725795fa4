"""``take``/``take_many``/``poll``/``async for`` over the K take pumps of a sharded queue.

A call looks at the shards from a rotating start (so none starves), prefetched items first, and tops up only
with other pumps' prefetched items, never another round trip, so it holds items only where it cannot be
interrupted. A shard is skipped while its pump knows its list is empty or waits out a failed pop's backoff, so
a call on K idle shards costs no K pops; every shard is looked at after ``recheck_s`` anyway (items pushed by
other code announce nothing). ``poll`` looks at every shard.
"""

from __future__ import annotations

from collections.abc import Awaitable, Sequence
from typing import Any

from .._consuming.take import NOT_PREFETCHED, TakePump
from .._consuming.traced import traced_take
from .._consuming.wait_loop import Look, WaitLoop
from .._util.tracing import tracer
from .layout import Rotation

__all__ = ["ShardedPump"]


class ShardedPump:
    """Serves items of all shards to callers; ``recheck_s``: the queue's safety poll, seconds."""

    def __init__(self, name: str, pumps: Sequence[TakePump], *, recheck_s: float) -> None:
        self._name = name
        self._pumps = list(pumps)
        self._rotation = Rotation(len(self._pumps))
        self._recheck_s = recheck_s
        self._waits = WaitLoop()

    def __repr__(self) -> str:
        return f"<ShardedPump {self._name!r} shards={len(self._pumps)}>"

    async def get(self, timeout_s: float | None, max_items: int = 1, *, once: bool = False,
                  with_headers: bool = False, traced: bool = True) -> list[Any]:
        """Up to ``max_items`` items, as :meth:`TakePump.get`: waits up to ``timeout_s`` (``None``:
        forever) for at least one; ``once`` (or 0): one look at every shard, no waiting.

        Raises:
            as :meth:`TakePump.get`: the closing queue's error, a permanent error of a shard's pop,
            and the caller's own cancellation (no item lost).
        """
        if traced and (found := tracer()) is not None:
            return await traced_take(found, self._name,
                                     self.get(timeout_s, max_items, once=once, with_headers=True, traced=False),
                                     with_headers)
        if timeout_s == 0:
            once, timeout_s = True, None
        order = self._order()
        got = await self._prefetched(order, max_items, with_headers)
        if got:  # the hot path: no round trip, no wait loop
            return got
        if once:
            return (await self._look(order, max_items, with_headers, everywhere=True))[0]
        first: list[TakePump] | None = order

        def look(woken: bool) -> Awaitable[Look[Any]]:
            nonlocal first
            order, first = first or self._order(), None  # each look after a wait starts one shard further
            return self._look(order, max_items, with_headers, everywhere=not woken)

        return await self._waits.run(look, timeout_s)

    def get_prefetched(self) -> Any:
        """:data:`NOT_PREFETCHED`: a caller across shards always calls :meth:`get` (see
        :meth:`TakePump.get_prefetched`)."""
        return NOT_PREFETCHED

    def _order(self) -> list[TakePump]:
        return [self._pumps[index] for index in self._rotation.order()]

    async def _look(self, order: list[TakePump], max_items: int, with_headers: bool, everywhere: bool) -> Look[Any]:
        """Items the pumps prefetched, else one pop attempt on each shard that may have items
        (``everywhere``: on the idle ones too), in ``order``, until one gives some. Found nothing:
        every pump's signal (taken before the pops: no announcement is missed) and how long until
        every shard is looked at anyway."""
        got = await self._prefetched(order, max_items, with_headers)
        if got:
            return got, set(), 0.0
        signals = {pump.signal for pump in order}
        for pump in order:
            if pump.idle() and not everywhere:
                continue
            got = await pump.get(None, max_items, once=True, with_headers=with_headers, traced=False)
            if got:
                return got + await self._prefetched(order, max_items - len(got), with_headers), set(), 0.0
        return [], signals, min([self._recheck_s, *(held for pump in order if (held := pump.held_s()) > 0)])

    async def _prefetched(self, order: list[TakePump], max_items: int, with_headers: bool) -> list[Any]:
        """Up to ``max_items`` items the pumps of ``order`` prefetched, in that order: no round trip,
        and nothing here suspends (see :attr:`TakePump.prefetched`)."""
        got: list[Any] = []
        for pump in order:
            if len(got) >= max_items:
                break
            if pump.prefetched:
                got += await pump.get(None, max_items - len(got), once=True, with_headers=with_headers,
                                      traced=False)
        return got
