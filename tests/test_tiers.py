"""Tiered pending (``tier_after_s``): unkeyed fast items due far ahead wait in per-bucket lists and
are promoted into the timeout zset before they fall due; they are delivered on time, in due order,
exactly once, by any queue object's transfer, and every whole-queue call sees them."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from redis.asyncio import Redis

from aiodelayq import BackendError, ConfigurationError, DelayedQueue, QueueCounts, QueueFullError
from aiodelayq._redis.acl import minimal_acl_rules
from aiodelayq._redis.connections import run_script
from aiodelayq._scripts import QueueScripts
from aiodelayq._wire.elements import classify_element, offer_args, unpack_tier_entry
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
    async with q:  # open first: a new bucket, announced on the channel, wakes the transfer task
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


@pytest.mark.waits
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


@pytest.mark.waits
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
    q = make_tiered(codec="str", capacity=5)
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


@pytest.mark.waits
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


@pytest.mark.waits
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
    q = make_tiered("orders", redis=client, codec="str", capacity=100)
    dues = await q.offer_many([(f"far{i}", 2.5 + 0.1 * i) for i in range(3)])
    await q.offer_many([("later", 3600), ("gone", 3600), ("also-gone", 7200)])
    assert (await q.counts()).tiered == 6
    assert await q.size() == 6
    assert [p.value for p in await q.peek(2)] == ["far0", "far1"]
    assert await q.read_all() == ["far0", "far1", "far2", "later", "gone", "also-gone"]
    assert await q.contains("gone")
    assert await q.remove("gone")
    assert await q.remove_all(["also-gone", "later"])
    assert await q.read_all() == ["far0", "far1", "far2"]
    await q.clear()
    assert await q.size() == 0
    dues = await q.offer_many([(f"far{i}", 2.5 + 0.1 * i) for i in range(3)])
    assert (await q.counts()).tiered == 3
    async with q:
        got = await take_all(q, client, 3)
    assert [item for item, _ in got] == ["far0", "far1", "far2"]
    assert all(at >= due for (_, at), due in zip(got, dues, strict=True))
    assert await q.size() == 0


# -- the walks, peek -------------------------------------------------------------------------------


async def offered_in_order(q: DelayedQueue[Any], client: Redis, pairs: list[tuple[str, float]]
                           ) -> tuple[list[str], list[str]]:
    """Offer ``pairs`` (one call); returns the payloads in the zset by due order and the tiered ones in
    walk order: bucket by bucket (start order), each in the order offered."""
    dues = await q.offer_many(pairs)
    tiered = await tiered_items(client, q)
    in_zset = [name for due, name in sorted(zip(dues, [p for p, _ in pairs], strict=True)) if name not in tiered]
    by_bucket = sorted((tiered[name] // 60_000, i, name) for i, (name, _) in enumerate(pairs) if name in tiered)
    return in_zset, [name for _, _, name in by_bucket]


async def test_read_all_walks_the_zset_then_each_bucket_in_the_order_offered(client: Redis, make_tiered: Any) -> None:
    q = make_tiered(codec="str", tier_after_s=60)
    # Far items of two buckets, offered out of due order; near ones and a keyed far one in the zset.
    pairs = [("far-b", 7230.0), ("far-a", 7210.0), ("near-2", 20.0), ("far-c", 7200.5), ("next-b", 7290.0),
             ("near-1", 10.0), ("next-a", 7270.0)]
    in_zset, tiered = await offered_in_order(q, client, pairs)
    assert len(tiered) == 5
    assert len(await buckets(client, q)) in (2, 3)
    await q.offer("keyed", 9000, key="k")
    expected = [*in_zset[:2], "keyed", *tiered]
    assert await q.read_all() == expected
    for page_size in (1, 2, 3):
        q._pending.page_size = page_size
        assert await q.read_all() == expected, page_size


async def test_contains_remove_and_remove_all_reach_the_buckets(client: Redis, make_tiered: Any) -> None:
    q = make_tiered(codec="str", tier_after_s=60)
    await q.offer_many([("same", 10), ("x", 3700), ("same", 3701), ("y", 3702), ("same", 7300), ("z", 7301)])
    assert await tiered_count(client, q) == 5
    assert await q.contains("y")
    assert not await q.contains("absent")
    assert await q.remove("same")  # the first in walk order: the zset's
    assert await client.zcard(q.keys.timeout_set) == 0
    assert await q.remove("y")
    assert await tiered_count(client, q) == 4
    assert not await q.contains("y")
    assert await q.remove_all(["same", "z"])
    assert await q.read_all() == ["x"]
    assert await q.size() == 1
    assert await tiered_count(client, q) == 1
    assert len(await buckets(client, q)) == 1  # the emptied bucket left the index
    assert await q.remove("x")
    assert await q.size() == 0
    assert not await client.exists(q.keys.tier_index, q.keys.tier_count)


async def test_remove_all_over_small_pages_misses_nothing_in_a_bucket(client: Redis, make_tiered: Any) -> None:
    q = make_tiered(codec="str", tier_after_s=60)
    names = [("a" if i % 3 else "b") for i in range(30)]
    await q.offer_many([(name, 3700 + i * 0.01) for i, name in enumerate(names)])
    assert sum(len(e) for e in (await buckets(client, q)).values()) == 30  # a bucket, or two
    for page_size in (1, 2, 4):
        q._pending.page_size = page_size
        assert await q.remove_all(["a"])
        assert await q.read_all() == ["b"] * 10
        await q.offer_many([("a", 3700 + i * 0.01) for i in range(20)])
    q._pending.page_size = 1
    assert await q.remove_all(["b"])
    assert sorted(await q.read_all()) == ["a"] * 20


async def test_a_tier_page_resumes_after_removals_and_promotions_under_it(client: Redis, make_tiered: Any) -> None:
    q = make_tiered(codec="str", tier_after_s=60)
    await q.offer_many([(f"e{i}", 3700 + i * 0.01) for i in range(10)])
    [(start, entries)] = (await buckets(client, q)).items()
    bucket = q.keys.tier_bucket(start)
    raw = await client.lrange(bucket, 0, -1)
    keys = [q.keys.timeout_set, q.keys.tier_index]

    async def page(cursor: bytes, member: bytes, size: int) -> tuple[list[str], bytes, bytes]:
        reply = await run_script(client, QueueScripts.read_page, keys, [cursor, member, size], timeout_s=5)
        return [p.decode() for p in reply[2:]], reply[0], reply[1]

    assert await page(b"", b"", 3) == ([], b"T", b"")  # the empty zset: the tier is next
    got, cursor, member = await page(b"T", b"", 3)
    assert got == ["e0", "e1", "e2"]
    await client.lrem(bucket, 1, raw[1])  # removed before the cursor: found again by the entry read last
    got, cursor, member = await page(cursor, member, 3)
    assert got == ["e3", "e4", "e5"]
    await client.lrem(bucket, 1, raw[5])  # the entry read last removed: one position back
    got, cursor, member = await page(cursor, member, 2)
    assert got == ["e6", "e7"]
    await client.rpop(bucket, 3)  # promoted from the tail: e7 (read last), e8, e9
    assert await page(cursor, member, 2) == ([], None, None)
    assert len(entries) == 10


async def test_peek_merges_the_zset_and_the_buckets_by_due_time(client: Redis, make_tiered: Any) -> None:
    q = make_tiered(codec="str", tier_after_s=60)
    await q.offer("keyed-late", 9000, key="k")  # in the zset, due after every tiered item
    dues = await q.offer_many([("t3", 3703.0), ("t1", 3701.0), ("near", 30.0), ("t2", 3702.0), ("u1", 3800.0)])
    assert await tiered_count(client, q) == 4
    peeked = await q.peek(10)
    assert [(p.value, p.key) for p in peeked] == [("near", None), ("t1", None), ("t2", None), ("t3", None),
                                                  ("u1", None), ("keyed-late", "k")]
    by_name = dict(zip(["t3", "t1", "near", "t2", "u1"], dues, strict=True))
    assert all(p.due_ms == by_name[p.value] for p in peeked if p.value in by_name)
    assert [p.value for p in await q.peek(2)] == ["near", "t1"]
    assert [p.value for p in await q.peek(1)] == ["near"]


async def test_the_dashboard_charts_count_tiered_items_at_their_bucket(client: Redis, make_tiered: Any) -> None:
    from aiodelayq.dashboard._pages import due_histogram

    q = make_tiered(codec="str", tier_after_s=60)
    await q.offer_many([("z", 10.0), ("h", 1950.0), ("d", 9000.0), ("l", 30 * 3600.0)])
    assert await tiered_count(client, q) == 3
    histogram = await due_histogram(client, q.keys)
    assert histogram.overdue == 0
    assert histogram.hour == [1, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0]  # z, then h in 30-35 min
    assert histogram.day == [2, 0, 1] + [0] * 21  # z and h, then d in 2-3 h
    assert histogram.later == 1


# -- resends, pause --------------------------------------------------------------------------------


async def test_a_resent_tiering_offer_writes_nothing_twice(client: Redis, make_tiered: Any) -> None:
    q = make_tiered(codec="str", tier_after_s=60)
    frags, _ = await q._producer.prepare([("a", 3700), ("b", 3760), ("c", 10)])
    args = [os.urandom(16), "", *offer_args("fast", frags, None, "", 60_000)]
    keys = [getattr(q.keys, name) for name in QueueScripts.offer.key_names]
    first = await run_script(client, QueueScripts.offer, keys, args, timeout_s=5)
    again = await run_script(client, QueueScripts.offer, keys, args, timeout_s=5)  # as a resend after a lost reply
    assert again[:2] == [first[0], None]
    assert await tiered_count(client, q) == 2
    assert sorted(await tiered_items(client, q)) == ["a", "b"]
    assert await q.size() == 3


@pytest.mark.waits
async def test_a_paused_queue_keeps_tiered_items_until_resumed(client: Redis, make_tiered: Any) -> None:
    q = make_tiered(codec="str")
    async with q:
        await q.pause()
        [due] = await q.offer_many([("far", 2.5)])
        assert await tiered_count(client, q) == 1
        assert await q.poll(3.5) is None  # promoted and moved meanwhile, but not handed out
        assert await tiered_count(client, q) == 0
        await q.resume()
        assert await asyncio.wait_for(q.take(), 5) == "far"
        assert await server_ms(client) >= due


@pytest.mark.waits
async def test_killed_connections_and_a_stall_lose_no_tiered_item_and_deliver_none_early(
        own_server: Any, make_client: Any, make_tiered: Any) -> None:
    # Promotions and transfers whose replies are cut off (every connection killed, over and over),
    # and a server stall while buckets fall due: a resent transfer promotes nothing twice, so every
    # item is received, none before its due time, and acked once.
    server = own_server()
    # One connection for the killer, which SKIPME spares: only the queue's are killed.
    client, admin = make_client(server), make_client(server, single_connection_client=True)
    q = make_tiered(redis=client, codec="str", safety_poll_s=1.0)
    n = 500
    dues = dict(zip((f"t{i}" for i in range(n)),
                    await q.offer_many([(f"t{i}", 2.5 + 2.0 * i / n) for i in range(n)]), strict=True))
    assert await tiered_count(admin, q) == n
    received: dict[str, list[float]] = {}

    async def consume() -> None:
        while len(received) < n:
            for m in await q.receive_many(50, 30, timeout=20):
                # This machine's clock, which the server's TIME reads too (no call: connections die).
                received.setdefault(m.value, []).append(time.time() * 1000)
                try:
                    await m.ack(confirm=True)
                except BackendError:
                    continue  # maybe not acked: delivered again later (a duplicate, never a loss)

    async with q:
        consumer = asyncio.create_task(consume())
        kills = 0
        for step in range(30):
            await asyncio.sleep(0.15)
            kills += int(await admin.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"))
            await admin.execute_command("CLIENT", "KILL", "TYPE", "pubsub")
            if step == 15:
                await admin.execute_command("CLIENT", "PAUSE", "1000", "ALL")
        await asyncio.wait_for(consumer, 60)  # does not hang: the last item is due 4.5 s after the offer
    assert set(received) == set(dues)  # nothing lost
    assert all(min(at) >= dues[item] for item, at in received.items())  # nothing early
    assert await q.size() == 0
    assert await tiered_count(admin, q) == 0
    print(f"\n{kills} connections killed; redelivered {sum(len(at) - 1 for at in received.values())}")
