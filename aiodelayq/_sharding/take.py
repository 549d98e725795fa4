"""``take``/``take_many``/``poll``/``async for`` over the K take pumps of a sharded queue.

A call looks at the shards in an order that starts one shard further each time (so none starves
under load): first for items a pump already prefetched (no round trip), then with one pop attempt
on each shard that may have items, until as many as asked came. A shard is skipped while its pump knows
its list is empty (its last pop came back short and nothing announced items since) or waits out a
failed pop's backoff; that keeps a call on K mostly idle shards from costing K pops. When nothing
came, the call waits on every pump's signal (a transfer, items given back, the queue closing) and
looks again; each item is handed to one caller only, and a cancelled caller loses none (each pump's
own guarantee: what a pop brought for nobody goes back to the head of its list).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from .._consuming.take import TakePump
from .._core.tracing import now_ns, receive_span, tracer
from ..exceptions import BackendError
from .fanout import redeliver_cancellation
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
        found = tracer() if traced else None
        if found is not None:
            started_ns = now_ns()
            pairs = await self.get(timeout_s, max_items, once=once, with_headers=True, traced=False)
            if pairs:
                receive_span(found, self._name, "take", started_ns, [headers for _, headers in pairs])
            return pairs if with_headers else [value for value, _ in pairs]
        if timeout_s == 0:
            once, timeout_s = True, None
        loop = asyncio.get_running_loop()
        deadline = None if timeout_s is None else loop.time() + timeout_s
        # Look even at shards that seem idle: a poll's one look, and a look after a recheck (items
        # pushed into a list by other code announce nothing).
        everywhere = once
        while True:
            order = [self._pumps[index] for index in self._rotation.order()]
            for pump in order:
                if pump.buffered:
                    got = await pump.get(None, max_items, once=True, with_headers=with_headers, traced=False)
                    if got:
                        return got
            signals = {pump.signal for pump in order}  # before the looks: no announcement is missed
            got = await self._look_around(order, max_items, with_headers, everywhere)
            if got or once:
                return got
            wait_s = min([self._recheck_s, *(held for pump in order if (held := pump.held_s()) > 0)])
            if deadline is not None:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    return []
                wait_s = min(wait_s, remaining)
            done, _ = await asyncio.wait(signals, timeout=wait_s, return_when=asyncio.FIRST_COMPLETED)
            everywhere = not done

    async def _look_around(self, order: list[TakePump], max_items: int, with_headers: bool,
                           everywhere: bool) -> list[Any]:
        """One pop attempt on each pump of ``order`` that may have items (``everywhere``: on each),
        until ``max_items`` came. A cancellation, or a permanent error, met with items in hand lets
        the caller have them first: the cancellation is raised again at its next await, the error
        by its next call."""
        got: list[Any] = []
        for pump in order:
            if pump.idle() and not everywhere:
                continue
            try:
                got += await pump.get(None, max_items - len(got), once=True, with_headers=with_headers, traced=False)
            except asyncio.CancelledError:
                if not got:
                    raise
                redeliver_cancellation()
                return got
            except BackendError:
                if not got:
                    raise
                return got
            if len(got) >= max_items:
                break
        return got
