"""Coalesces concurrent ``offer()`` calls into one offer script call per round trip."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

__all__ = ["OfferBatcher"]


class OfferBatcher:
    """While one script call is in flight, offers that arrive wait and go out together in the next.

    A lone offer is sent at once (no added latency); under concurrency each round trip carries every
    offer that arrived meanwhile (up to ``max_batch``), which is what makes many awaiting callers
    fast. The flush task lives only while offers are waiting or in flight; callers await their own
    future, so a cancelled caller whose offer was not sent yet is simply left out (an offer already
    sent may have been written, as with any cancelled request).
    """

    def __init__(self, send: Callable[[list[list[Any]]], Awaitable[list[int]]], max_batch: int = 1000) -> None:
        self._send = send
        self._max_batch = max_batch
        self._pending: list[tuple[list[Any], asyncio.Future[int]]] = []
        self._flusher: asyncio.Task[None] | None = None

    async def submit(self, triple: list[Any]) -> int:
        """Queue one ``[delay_ms, id, payload]`` triple; return its due time (epoch ms)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[int] = loop.create_future()
        self._pending.append((triple, future))
        if self._flusher is None:
            self._flusher = loop.create_task(self._flush(), name="aiodelayq-offer-batch")
        return await future

    async def _flush(self) -> None:
        try:
            while self._pending:
                batch = [(t, f) for t, f in self._pending[: self._max_batch] if not f.done()]
                del self._pending[: self._max_batch]
                if not batch:
                    continue
                try:
                    dues = await self._send([t for t, _ in batch])
                except BaseException as exc:
                    for _, future in batch:
                        if not future.done():
                            future.set_exception(exc)
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
