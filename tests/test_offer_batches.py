"""Concurrent ``offer()`` calls: coalesced into script calls, at most two in flight (``_producing/batcher.py``)."""

from __future__ import annotations

import asyncio
from typing import Any

from redis.asyncio import Redis

from aiodelayq import DelayedQueue


def _count_calls(q: DelayedQueue[Any]) -> dict[str, Any]:
    """Wrap the producer's OFFER sender (the real one still runs) to record calls in flight."""
    producer = q._producer
    real = producer._send
    seen: dict[str, Any] = {"in_flight": 0, "most": 0, "sizes": []}

    async def counting(fragments: Any, issued: float, entries: Any) -> list[int]:
        seen["in_flight"] += 1
        seen["most"] = max(seen["most"], seen["in_flight"])
        seen["sizes"].append(len(fragments))
        try:
            return await real(fragments, issued, entries)
        finally:
            seen["in_flight"] -= 1

    producer._send = counting  # type: ignore[method-assign]
    return seen


async def test_concurrent_offers_overlap_in_at_most_two_calls(client: Redis, make_queue: Any) -> None:
    q: DelayedQueue[int] = make_queue(codec="json")
    seen = _count_calls(q)

    async def caller(c: int) -> list[int]:
        return [await q.offer(c * 100 + i, 60) for i in range(20)]

    dues = await asyncio.gather(*(caller(c) for c in range(64)))
    assert seen["most"] == 2  # the server runs one call while the next is prepared, never more
    assert sum(seen["sizes"]) == 64 * 20
    assert max(seen["sizes"]) < 64  # split: not one call carrying every caller
    assert await q.size() == 64 * 20
    assert all(isinstance(d, int) for ds in dues for d in ds)


async def test_a_lone_offer_goes_out_alone_at_once(client: Redis, make_queue: Any) -> None:
    q: DelayedQueue[int] = make_queue(codec="json")
    seen = _count_calls(q)
    for i in range(3):
        await q.offer(i, 60)
    assert seen["sizes"] == [1, 1, 1]
    assert seen["most"] == 1


async def test_a_caller_cancelled_before_its_call_leaves_the_others_alone(client: Redis, make_queue: Any) -> None:
    q: DelayedQueue[int] = make_queue(codec="json")
    seen = _count_calls(q)
    tasks = [asyncio.ensure_future(q.offer(i, 60)) for i in range(40)]
    await asyncio.sleep(0)  # every offer is waiting: the first calls are out, the rest queued
    tasks[-1].cancel()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert isinstance(results[-1], asyncio.CancelledError)
    assert all(isinstance(r, int) for r in results[:-1])
    assert await q.size() == sum(seen["sizes"])
    assert 39 <= await q.size() <= 40  # the cancelled one only if its call had gone out
