"""Tiered pending (``tier_after_s``): unkeyed fast items due far ahead wait in per-bucket lists and
are promoted into the timeout zset before they fall due; they are delivered on time, in due order,
exactly once, by any queue object's transfer, and every whole-queue call sees them."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from redis.asyncio import Redis

from aiodelayq import ConfigurationError, DelayedQueue, QueueCounts, QueueFullError
from aiodelayq._redis.acl import minimal_acl_rules
from aiodelayq._wire.elements import classify_element, unpack_tier_entry
from aiodelayq.testing import server_version
from tests.helpers import server_ms

# The shortest horizon (seconds): buckets of 1 s, promoted 1 s before their start, so an item due
# more than about 2 s ahead is tiered and the tests wait seconds, not minutes.
AFTER_S = 1.0


@pytest.fixture
async def make_tiered(make_queue: Callable[..., DelayedQueue[Any]]) -> AsyncIterator[Callable[..., DelayedQueue[Any]]]:
    """``make_queue`` with ``tier_after_s=AFTER_S`` unless given; every queue made is cleared after the
    test (its bucket lists are not among ``keys.all``, which the keys fixture deletes)."""
    made: list[DelayedQueue[Any]] = []

    def factory(name: str | None = None, redis: Redis | None = None, **kwargs: Any) -> DelayedQueue[Any]:
        kwargs.setdefault("tier_after_s", AFTER_S)
        queue = make_queue(name, redis, **kwargs)
        made.append(queue)
        return queue

    yield factory
    for queue in made:
        await queue.clear()


async def buckets(client: Redis, q: DelayedQueue[Any]) -> dict[int, list[tuple[int, bytes]]]:
    """The tier's buckets: start ms -> its entries as (due ms, element), in list order."""
    out = {}
    for member in await client.zrange(q.keys.tier_index, 0, -1):
        start = int(member)
        out[start] = [unpack_tier_entry(e, start) for e in await client.lrange(q.keys.tier_bucket(start), 0, -1)]
    return out


async def tiered_count(client: Redis, q: DelayedQueue[Any]) -> int:
    return int(await client.get(q.keys.tier_count) or 0)


async def take_all(q: DelayedQueue[Any], client: Redis, n: int, timeout_s: float = 20) -> list[tuple[Any, float]]:
    """``n`` items taken one by one, each with the server's clock (ms) when it came back."""
    out = []
    for _ in range(n):
        item = await asyncio.wait_for(q.take(), timeout_s)
        out.append((item, await server_ms(client)))
    return out


def payload_of(element: bytes) -> str:
    """The payload of a fast element of a 64-bit server (29-byte header), as text."""
    return element[29:].decode()


async def tiered_items(client: Redis, q: DelayedQueue[Any]) -> dict[str, int]:
    """Payload -> due ms of every tiered item."""
    return {payload_of(element): due for entries in (await buckets(client, q)).values() for due, element in entries}


async def test_far_items_wait_in_buckets_and_come_out_on_time_in_due_order(client: Redis, make_tiered: Any) -> None:
    q = make_tiered(codec="str")
    async with q:  # open first: a new bucket, announced on the channel, wakes the scheduler
        delays = [0.3, 0.6, 2.4, 2.9, 3.1, 3.6, 4.2]
        dues = await q.offer_many([(f"d{d}", d) for d in delays])
        keyed = await q.offer("keyed", 3.3, key="k")  # between them, never tiered
        # A bucket of 1 s that starts more than 1 s from now: every item due in 2.4 s or more.
        tiered = await tiered_items(client, q)
        assert tiered == {f"d{d}": due for d, due in zip(delays, dues, strict=True) if d >= 2.4}
        for start, entries in (await buckets(client, q)).items():
            assert start % 1000 == 0
            assert all(start <= due < start + 1000 for due, _ in entries)
            assert all(classify_element(element, "<Q") == "fast" for _, element in entries)
        assert await tiered_count(client, q) == 5
        assert await client.zcard(q.keys.timeout_set) == 3
        got = await take_all(q, client, len(delays) + 1)
    expected = sorted([*zip(dues, [f"d{d}" for d in delays], strict=True), (int(keyed), "keyed")])
    assert [item for item, _ in got] == [name for _, name in expected]
    assert all(at >= due for (_, at), (due, _) in zip(got, expected, strict=True))  # never early
    assert await buckets(client, q) == {}
    assert not await client.exists(q.keys.tier_index, q.keys.tier_count)


async def test_due_order_holds_across_the_horizon_boundary(client: Redis, make_tiered: Any) -> None:
    # Tiered items and, due between them, items that go straight to the zset (from an object
    # without the option, and from the tiering one: due within its horizon); one consumer.
    q = make_tiered(codec="str")
    plain = make_tiered(codec="str", tier_after_s=None)
    tiered = await q.offer_many([(f"t{i}", 2.5 + 0.2 * i) for i in range(5)])
    near = await q.offer_many([(f"n{i}", 0.2 + 0.2 * i) for i in range(3)])
    between = await plain.offer_many([(f"p{i}", 2.6 + 0.2 * i) for i in range(5)])
    assert set(await tiered_items(client, q)) == {f"t{i}" for i in range(5)}
    dues = sorted([*zip(tiered, [f"t{i}" for i in range(5)], strict=True),
                   *zip(near, [f"n{i}" for i in range(3)], strict=True),
                   *zip(between, [f"p{i}" for i in range(5)], strict=True)])
    assert len({due for due, _ in dues}) == len(dues)
    async with q:
        got = await take_all(q, client, len(dues))
    assert [item for item, _ in got] == [name for _, name in dues]
    assert all(at >= due for (_, at), (due, _) in zip(got, dues, strict=True))


async def test_a_queue_object_without_the_option_promotes_and_delivers_them(client: Redis, make_tiered: Any) -> None:
    producer = make_tiered(codec="str")
    dues = await producer.offer_many([(f"x{i}", 2.5 + 0.1 * i) for i in range(10)])
    assert await tiered_count(client, producer) == 10
    consumer = make_tiered(codec="str", tier_after_s=None)
    assert consumer.tier_after_s is None
    assert producer.tier_after_s == AFTER_S
    async with consumer:
        got = await take_all(consumer, client, 10)
        assert await consumer.poll(0.3) is None
    assert [item for item, _ in got] == [f"x{i}" for i in range(10)]
    assert all(at >= due for (_, at), due in zip(got, dues, strict=True))
    assert await tiered_count(client, producer) == 0


async def test_size_counts_and_clear_cover_the_tier(client: Redis, make_tiered: Any) -> None:
    q = make_tiered(codec="str", tier_after_s=60)
    await q.offer_many([("near", 30), ("far1", 3600), ("far2", 7200)])
    plain = make_tiered(codec="str", tier_after_s=None)
    await plain.offer("plain-far", 7200)  # an object without the option keeps its items in the zset
    assert await tiered_count(client, q) == 2
    for queue in (q, plain):
        assert await queue.size() == 4
        counts = await queue.counts()
        assert (counts.pending, counts.tiered, counts.lag_ms) == (4, 2, 0)
    # The earliest due time comes from the tier when the zset's head is later.
    await client.zrem(q.keys.timeout_set, *await client.zrange(q.keys.timeout_set, 0, 0))
    assert (await q.counts()).next_due_ms == (await tiered_items(client, q))["far1"]
    await q.clear()
    assert await q.size() == 0
    assert await q.counts() == QueueCounts(0, 0, 0, 0, None)
    assert await buckets(client, q) == {}
    assert not await client.exists(q.keys.tier_index, q.keys.tier_count, q.keys.timeout_set)


async def test_clear_drops_many_buckets_over_several_calls(client: Redis, make_tiered: Any) -> None:
    q = make_tiered(codec="str")
    await q.offer_many([(f"i{i}", 10 + i) for i in range(1200)])  # one bucket a second: 1,200 buckets
    assert await client.zcard(q.keys.tier_index) == 1200
    await q.clear()
    assert await q.size() == 0
    assert await client.zcard(q.keys.tier_index) == 0
    assert await buckets(client, q) == {}


async def test_max_pending_counts_tiered_items(client: Redis, make_tiered: Any) -> None:
    q = make_tiered(codec="str", max_pending=5)
    await q.offer_many([(f"f{i}", 3600 + i) for i in range(4)])
    assert await tiered_count(client, q) == 4
    await q.offer("near", 10)
    with pytest.raises(QueueFullError):
        await q.offer("one too many", 3600)
    with pytest.raises(QueueFullError):
        await q.offer("one too many", 0)
    assert await q.size() == 5


async def test_keyed_strict_and_legacy_items_are_never_tiered(client: Redis, make_tiered: Any) -> None:
    q = make_tiered(codec="str")
    await q.offer("keyed", 3600, key="k1")
    await q.offer_many([("k2", 3600), ("k3", 7200)], keys=["k2", "k3"])
    await q.schedule("tick", "recurring", every=3600)
    strict = make_tiered(codec="str", tier_after_s=None, strict=True)
    await strict.offer("strict", 3600)
    legacy = make_tiered(codec="str", tier_after_s=None, wire_format="redisson-legacy")
    await legacy.offer("legacy", 3600)
    assert await tiered_count(client, q) == 0
    assert not await client.exists(q.keys.tier_index)
    assert await client.zcard(q.keys.timeout_set) == 6
    assert (await q.get("k1")).value == "keyed"  # type: ignore[union-attr]
    assert await q.reschedule("k2", 7200) is not None
    assert await q.cancel("k3")
    assert await tiered_count(client, q) == 0


@pytest.mark.parametrize("value", [0, 0.5, -1, float("nan"), float("inf"), True, "60"])
async def test_a_bad_tier_after_s_is_refused_naming_the_option(make_queue: Any, value: Any) -> None:
    with pytest.raises(ConfigurationError, match="tier_after_s"):
        make_queue(tier_after_s=value)


@pytest.mark.parametrize("options", [{"strict": True}, {"wire_format": "redisson-legacy"}])
async def test_tier_after_s_needs_fast_elements(make_queue: Any, options: dict[str, Any]) -> None:
    with pytest.raises(ConfigurationError, match="tier_after_s"):
        make_queue(tier_after_s=60, **options)


async def test_a_bucket_larger_than_one_promotion_call_is_promoted_across_calls(client: Redis,
                                                                                make_tiered: Any) -> None:
    # transfer_batch bounds the entries one transfer promotes: 1,000 entries of one bucket take ten.
    q = make_tiered(codec="str", transfer_batch=100)
    dues = await q.offer_many([(f"i{i}", 2.5) for i in range(1000)])
    assert len(set(dues)) == 1
    assert [len(entries) for entries in (await buckets(client, q)).values()] == [1000]
    async with q:
        got: list[str] = []
        while len(got) < 1000:
            got += await asyncio.wait_for(q.take_many(1000), 20)
        assert await q.poll(0.3) is None
        assert q.stats.transfers >= 10
    assert sorted(got) == sorted(f"i{i}" for i in range(1000))
    assert await q.size() == 0


async def test_a_huge_single_second_bucket_is_delivered_exactly_once(client: Redis, make_tiered: Any) -> None:
    q = make_tiered(codec="str")
    await make_tiered(f"{q.name}:warm").offer("warm", 0)  # the client's clock estimate: one issue time for all
    n = 50_000
    dues = await q.offer_many([(f"i{i}", 3.0) for i in range(n)])  # 50 calls, sent at once
    assert len(set(dues)) == 1
    assert [len(entries) for entries in (await buckets(client, q)).values()] == [n]
    async with q:
        got: list[str] = []
        while len(got) < n:
            got += await asyncio.wait_for(q.take_many(1000), 60)
        assert await q.poll(0.3) is None
    assert len(got) == n
    assert set(got) == {f"i{i}" for i in range(n)}
    assert await q.size() == 0
    assert await tiered_count(client, q) == 0


async def test_a_published_bucket_wakes_an_open_queue_with_nothing_else_pending(client: Redis,
                                                                                 make_tiered: Any) -> None:
    consumer = make_tiered(codec="str", tier_after_s=None, safety_poll_s=60)
    producer = make_tiered(codec="str")
    async with consumer:
        await asyncio.sleep(0.1)  # the first transfer found nothing: no timer is armed
        [due] = await producer.offer_many([("far", 2.6)])
        assert await tiered_count(client, producer) == 1
        assert await asyncio.wait_for(consumer.take(), 10) == "far"
        assert await server_ms(client) >= due


async def test_the_minimal_acl_user_offers_promotes_and_reads_tiered_items(acl_client: Any, make_tiered: Any,
                                                                         redis_server: Any) -> None:
    version = tuple(int(x) for x in server_version(redis_server.kind.binary).split(".")[:2])
    rules = ["on", ">secret", *minimal_acl_rules("orders", waitaof=version >= (7, 2))]
    client = await acl_client("tier-user", "secret", rules)
    q = make_tiered("orders", redis=client, codec="str", max_pending=100)
    dues = await q.offer_many([(f"far{i}", 2.5 + 0.1 * i) for i in range(3)])
    await q.offer_many([("later", 3600), ("gone", 3600), ("also-gone", 7200)])
    assert (await q.counts()).tiered == 6
    assert await q.size() == 6
    await q.clear()
    assert await q.size() == 0
    dues = await q.offer_many([(f"far{i}", 2.5 + 0.1 * i) for i in range(3)])
    assert (await q.counts()).tiered == 3
    async with q:
        got = await take_all(q, client, 3)
    assert [item for item, _ in got] == ["far0", "far1", "far2"]
    assert all(at >= due for (_, at), due in zip(got, dues, strict=True))
    assert await q.size() == 0
