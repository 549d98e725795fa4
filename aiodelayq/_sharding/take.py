"""``take``/``take_many``/``poll``/``async for`` over the K take pumps of a sharded queue.

A call looks at the shards in an order that starts one shard further each time (so none starves
under load): first for items the pumps already prefetched (no round trip), then with one pop attempt
on each shard that may have items, until one gives some; those are topped up with what other pumps
prefetched, never with another round trip, so the call holds items only where it cannot be
interrupted (a cancelled caller loses nothing: what a pop brought for nobody goes back to the head of
its list, each pump's own guarantee). A shard is skipped while its pump knows its list is empty (its
last pop came back short and nothing announced items since) or waits out a failed pop's backoff:
a call on K idle shards then costs no K pops. When nothing came, the call waits on every pump's
signal (a transfer, items given back, the queue closing) and looks again, and at every shard after
``recheck_s`` (items pushed into a list by other code announce nothing). ``poll`` looks at every shard.
"""

from __future__ import annotations

from collections.abc import Awaitable, Sequence
from typing import Any

from .._consuming.take import TakePump
from .._consuming.traced import traced_take
from .._consuming.wait_loop import Look, WaitLoop
from .._util.tracing import tracer
from .layout import Rotation

__all__ = ["ShardedPump"]


class ShardedPump:
    """Serves items of all shards to callers (see the module docstring); ``recheck_s``: the longest
    a waiting caller goes without looking at every shard anyway (the queue's safety poll)."""

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
        if once:  # one look, even at the shards that seem idle
            return (await self._look(order, max_items, with_headers, everywhere=True))[0]
        first: list[TakePump] | None = order

        def look(woken: bool) -> Awaitable[Look[Any]]:
            nonlocal first
            order, first = first or self._order(), None  # each look after a wait starts one shard further
            return self._look(order, max_items, with_headers, everywhere=not woken)

        return await self._waits.run(look, timeout_s)

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
