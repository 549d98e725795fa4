"""Coalesces concurrent ``offer()`` calls into one offer script call per round trip."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

__all__ = ["OfferBatcher"]


class OfferBatcher:
    """While one script call is in flight, offers that arrive wait and go out together in the next.

    A lone offer is sent at once (no added latency); under concurrency each round trip carries every
    offer that arrived meanwhile, up to ``max_items`` items and ``max_bytes`` bytes (an item larger
    than ``max_bytes`` goes alone), so one big item never makes small ones fail with it. The flush
    task lives only while offers are waiting or in flight; callers await their own future, so a
    cancelled caller whose offer was not sent yet is simply left out (an offer already sent may have
    been written, as with any cancelled request).
    """

    def __init__(self, send: Callable[[list[Any]], Awaitable[list[int]]], *, max_items: int,
                 max_bytes: int, size: Callable[[Any], int]) -> None:
        self._send = send
        self._max_items = max_items
        self._max_bytes = max_bytes
        self._size = size
        self._pending: list[tuple[Any, asyncio.Future[int]]] = []
        self._flusher: asyncio.Task[None] | None = None

    def __repr__(self) -> str:
        return f"<OfferBatcher pending={len(self._pending)} flushing={self._flusher is not None}>"

    async def submit(self, fragment: Any) -> int:
        """Queue one prepared item; return its due time (epoch ms)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[int] = loop.create_future()
        self._pending.append((fragment, future))
        if self._flusher is None:
            self._flusher = loop.create_task(self._flush(), name="aiodelayq-offer-batch")
        return await future

    def _next_batch(self) -> list[tuple[Any, asyncio.Future[int]]]:
        batch: list[tuple[Any, asyncio.Future[int]]] = []
        size = 0
        taken = 0
        for fragment, future in self._pending:
            fragment_size = self._size(fragment)
            if batch and (len(batch) >= self._max_items or size + fragment_size > self._max_bytes):
                break
            taken += 1
            if not future.done():
                batch.append((fragment, future))
                size += fragment_size
        del self._pending[:taken]
        return batch

    async def _flush(self) -> None:
        try:
            while self._pending:
                batch = self._next_batch()
                if not batch:
                    continue
                try:
                    dues = await self._send([t for t, _ in batch])
                except BaseException as exc:
                    for _, future in batch:
                        if not future.done():
                            future.set_exception(exc)
                            future.exception()  # retrieved: its caller may have left
                    if isinstance(exc, asyncio.CancelledError):
                        raise
                    continue
                for (_, future), due in zip(batch, dues, strict=True):
                    if not future.done():
                        future.set_result(due)
        finally:
            self._flusher = None
            for _, future in self._pending:
                if not future.done():
                    future.cancel()
            self._pending.clear()
