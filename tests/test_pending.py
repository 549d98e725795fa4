"""The pending side, with Redisson RDelayedQueue semantics: size, contains, read_all, remove, clear."""

from __future__ import annotations

from typing import Any

from redis.asyncio import Redis


async def test_duplicates_stay_distinct(make_queue: Any) -> None:
    q = make_queue()
    await q.offer("same", 60)
    await q.offer("same", 60)
    assert await q.size() == 2
    assert await q.read_all() == ["same", "same"]


async def test_read_all_is_insertion_order_not_due_order(make_queue: Any) -> None:
    q = make_queue()
    for i, delay in enumerate([50, 10, 30, 20]):
        await q.offer(i, delay)
    assert await q.read_all() == [0, 1, 2, 3]


async def test_contains_and_remove_first_match_only(make_queue: Any) -> None:
    q = make_queue()
    await q.offer_many([("a", 60), ("b", 60), ("a", 61), ("c", 62)])
    assert await q.contains("a")
    assert not await q.contains("zzz")
    assert await q.remove("a")
    assert await q.read_all() == ["b", "a", "c"]
    assert await q.remove("a")
    assert not await q.remove("a")
    assert not await q.contains("a")
    assert await q.size() == 2


async def test_remove_cancels_delivery(client: Redis, make_queue: Any) -> None:
    q = make_queue()
    await q.offer_many([("keep", 0.2), ("cancel", 0.1)])
    assert await q.remove("cancel")
    async with q:
        assert await q.take() == "keep"
        assert await q.poll(0.3) is None
    assert await client.zcard(q.keys.timeout_set) == 0


async def test_remove_all(make_queue: Any) -> None:
    q = make_queue()
    await q.offer_many([("a", 60), ("b", 60), ("a", 60), ("c", 60), ("d", 60)])
    assert await q.remove_all(["a", "c", "missing"])
    assert await q.read_all() == ["b", "d"]
    assert not await q.remove_all(["a"])
    assert not await q.remove_all([])


async def test_clear_drops_pending_but_not_ready_items(client: Redis, make_queue: Any) -> None:
    q = make_queue()
    await q.offer("ready", 0)
    async with q:
        assert await q.ready_size() == 1  # open() ran the first transfer
        await q.offer_many([("p1", 60), ("p2", 60)])
        assert await q.size() == 2
        await q.clear()
        assert await q.size() == 0
        assert await client.exists(q.keys.timeout_set) == 0
        assert await q.ready_size() == 1
        assert await q.take() == "ready"


async def test_offer_many_longer_than_one_script_call(make_queue: Any) -> None:
    q = make_queue()
    dues = await q.offer_many([(i, 60) for i in range(2500)])
    assert len(dues) == 2500
    assert await q.size() == 2500
    assert await q.read_all() == list(range(2500))  # insertion order across script calls


async def test_strict_mode_keeps_redissons_list_exactly(client: Redis, make_queue: Any) -> None:
    q = make_queue(strict=True)
    await q.offer_many([(i, 0.05 * (i % 3)) for i in range(30)])
    assert await client.llen(q.keys.delay_list) == 30
    async with q:
        got = [await q.take() for _ in range(30)]
    assert sorted(got) == list(range(30))
    assert await client.llen(q.keys.delay_list) == 0  # LREMed as Redisson's transfer does
    assert await client.zcard(q.keys.timeout_set) == 0
