"""Coalesces concurrent ``offer()`` calls into few offer script calls, at most two in flight."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

__all__ = ["OfferBatcher"]

# Under load a call goes out once as many offers wait as the calls in flight carry (at least
# SPLIT_MIN_ITEMS), so the server runs one call while this process prepares the next.
MAX_IN_FLIGHT = 2
SPLIT_MIN_ITEMS = 16


class OfferBatcher:
    """Sends waiting offers in script calls, at most :data:`MAX_IN_FLIGHT` at a time.

    Offers of one loop turn go out together, up to ``max_items()`` items and ``max_bytes`` bytes (a
    larger item goes alone, so it never fails small ones). A cancelled caller whose offer was not
    sent is left out. Two calls in flight may run in either order: one caller's awaited offers are
    never in flight together.
    """

    def __init__(self, send: Callable[[list[Any]], Awaitable[list[Any]]], *, max_items: Callable[[], int],
                 max_bytes: int, size: Callable[[Any], int]) -> None:
        self._send = send
        self._max_items = max_items
        self._max_bytes = max_bytes
        self._size = size
        self._pending: list[tuple[Any, asyncio.Future[int]]] = []
        self._calls: set[asyncio.Task[None]] = set()
        self._flush_soon = False
        self._in_flight_items = 0

    def __repr__(self) -> str:
        return f"<OfferBatcher pending={len(self._pending)} in_flight={len(self._calls)}>"

    @property
    def in_flight(self) -> int:
        """Script calls in flight."""
        return len(self._calls)

    async def submit(self, fragment: Any) -> int:
        """Queue one prepared item; return its due time (epoch ms)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[int] = loop.create_future()
        self._pending.append((fragment, future))
        if len(self._pending) >= max(SPLIT_MIN_ITEMS, self._in_flight_items):
            self._flush()
        elif not self._flush_soon:
            # After the callbacks already due in this loop turn: the offers they make join this call.
            self._flush_soon = True
            loop.call_soon(self._flush_now)
        return await future

    def _flush_now(self) -> None:
        self._flush_soon = False
        self._flush()

    def _flush(self) -> None:
        """Start calls for the waiting offers while fewer than MAX_IN_FLIGHT are in flight."""
        loop = asyncio.get_running_loop()
        while self._pending and len(self._calls) < MAX_IN_FLIGHT:
            batch = self._next_batch()
            if batch:
                self._in_flight_items += len(batch)
                self._calls.add(loop.create_task(self._call(batch), name="aiodelayq-offer-batch"))

    def _next_batch(self) -> list[tuple[Any, asyncio.Future[int]]]:
        batch: list[tuple[Any, asyncio.Future[int]]] = []
        size = 0
        taken = 0
        most = self._max_items()
        for fragment, future in self._pending:
            fragment_size = self._size(fragment)
            if batch and (len(batch) >= most or size + fragment_size > self._max_bytes):
                break
            taken += 1
            if not future.done():
                batch.append((fragment, future))
                size += fragment_size
        del self._pending[:taken]
        return batch

    async def _call(self, batch: list[tuple[Any, asyncio.Future[int]]]) -> None:
        task = asyncio.current_task()
        cancelled = False
        try:
            dues = await self._send([t for t, _ in batch])
            for (_, future), due in zip(batch, dues, strict=True):
                if future.done():
                    continue
                if isinstance(due, BaseException):  # this offer alone was refused (a full queue)
                    future.set_exception(due)
                    future.exception()  # retrieved: its caller may have left
                else:
                    future.set_result(due)
        except asyncio.CancelledError:
            cancelled = True
            for _, future in batch:
                future.cancel()
            raise
        except BaseException as exc:
            for _, future in batch:  # the callers see it
                if not future.done():
                    future.set_exception(exc)
                    future.exception()  # retrieved: its caller may have left
            if not isinstance(exc, Exception):
                raise  # KeyboardInterrupt, SystemExit
        finally:
            assert task is not None
            self._calls.discard(task)
            self._in_flight_items -= len(batch)
            if cancelled:
                # The loop is closing (or the queue's owner cancelled us): no new calls; offers
                # still waiting are cancelled, as their callers would be.
                for _, future in self._pending:
                    future.cancel()
                self._pending.clear()
            else:
                self._flush()
