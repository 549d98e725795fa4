"""The wait loop of a consuming call that waits: look, and when nothing came, wait until something
says more may be there or a bound passes, then look again, until something comes or the call's
timeout passes. The reliable consumer and the sharded take and receive share it; each says what one
look is.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from .._util.clock import reached

__all__ = ["Look", "WaitLoop"]

E = TypeVar("E")

Look = tuple[list[E], "asyncio.Future[Any] | set[asyncio.Future[Any]]", float]
"""What one look found, the future(s) done once more may be there, and the longest wait (s) before
looking again anyway."""


class WaitLoop:
    """The wait loops of one consumer's calls; ``waiting``: how many of them wait now."""

    def __init__(self) -> None:
        self.waiting = 0

    def __repr__(self) -> str:
        return f"<WaitLoop waiting={self.waiting}>"

    async def run(self, look: Callable[[bool], Awaitable[Look[E]]], timeout_s: float | None) -> list[E]:
        """``look(woken)`` until it finds something, waiting between looks as it says; ``[]`` once
        ``timeout_s`` has passed (``None``: never). ``woken`` is whether one of its futures ended the
        wait before (``False``: the wait's bound did; ``True`` at the first look)."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout_s is None else loop.time() + timeout_s
        woken = True
        while True:
            got, wakes, wait_s = await look(woken)
            if got:
                return got
            if deadline is not None:
                now = loop.time()
                if reached(now, deadline):
                    return []
                remaining = deadline - now
                wait_s = min(wait_s, remaining)
            self.waiting += 1
            try:
                done, _ = await asyncio.wait(wakes if isinstance(wakes, set) else {wakes}, timeout=wait_s,
                                             return_when=asyncio.FIRST_COMPLETED)
            finally:
                self.waiting -= 1
            woken = bool(done)
