"""The pending side, with Redisson RDelayedQueue semantics: size, contains, read_all, remove, clear; what
on-call people read: counts() (one atomic call) and peek() (the soonest due, decoded, keyed); and walks
that page over the pending items, correct while transfers run and with a million pending."""

from __future__ import annotations

import asyncio
import os
import random
from collections.abc import Awaitable
from typing import Any

import pytest
from redis.asyncio import Redis

from aiodelayq import ConfigurationError, DelayedQueue, QueueCounts
from aiodelayq._redis.connections import run_script
from aiodelayq._scripts import PAGE_SIZE, QueueScripts
from tests.helpers import server_ms, until


async def test_duplicates_stay_distinct(make_queue: Any) -> None:
    q = make_queue()
    await q.offer("same", 60)
    await q.offer("same", 60)
    assert await q.size() == 2
    assert await q.read_all() == ["same", "same"]


async def test_read_all_is_due_order(make_queue: Any) -> None:
    # read_all() pages over the timeout zset, the one key that holds every pending element.
    q = make_queue()
    for i, delay in enumerate([50, 10, 30, 20]):
        await q.offer(i, delay)
    assert await q.read_all() == [1, 3, 2, 0]


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


# -- counts() and peek(): what on-call people read ---------------------------------------------------


async def test_counts_reads_every_part_of_a_queue(client: Redis, make_queue: Any) -> None:
    q = make_queue(codec="json", max_deliveries=1)
    assert await q.counts() == QueueCounts(0, 0, 0, 0, None)
    later = await q.offer({"n": 1}, 60)
    await q.offer({"n": 2}, 120)
    for n in range(3):
        await q.offer({"ready": n}, 0)
    await client.rpush(q.keys.dead_letter, b"garbage")
    async with q:
        await until(lambda: _ready_is(q, 3))
        message = await q.receive(30)
        assert message is not None
        counts = await q.counts()
        assert counts == QueueCounts(pending=2, ready=2, in_flight=1, dead_letters=1, next_due_ms=int(later))
        await message.ack(confirm=True)
    assert (await q.counts()).in_flight == 0


async def test_counts_lag_is_how_late_the_earliest_due_item_is(client: Redis, make_queue: Any) -> None:
    q = make_queue()  # never opened: nothing moves what falls due
    await q.offer("later", 60)
    assert (await q.counts()).lag_ms == 0  # nothing due
    before = await server_ms(client)
    await q.offer("due", 0)
    offered = await server_ms(client)
    await asyncio.sleep(0.2)
    read = await server_ms(client)
    counts = await q.counts()
    assert read - offered - 1 <= counts.lag_ms <= await server_ms(client) - before + 1
    async with q:  # the transfer moves it: no lag, the item waits in the ready list
        await until(lambda: _ready_is(q, 1))
        assert (await q.counts()).lag_ms == 0


async def _ready_is(q: Any, n: int) -> bool:
    return bool(await q.ready_size() == n)


@pytest.mark.parametrize("strict", [False, True])
async def test_peek_lists_the_soonest_due_with_keys(client: Redis, make_queue: Any, strict: bool) -> None:
    q = make_queue(codec="json", strict=strict)
    third = await q.offer({"n": 3}, 300)
    first = await q.offer({"n": 1}, 100, key="order-1")
    second = await q.offer({"n": 2}, 200)
    await q.offer({"n": 4}, 400, key="order-4")
    items = await q.peek(3)
    assert [(i.due_ms, i.value, i.key) for i in items] == [
        (int(first), {"n": 1}, "order-1"), (int(second), {"n": 2}, None), (int(third), {"n": 3}, None)]
    assert all(i.decodable and not i.malformed for i in items)
    assert items[0].raw == b'{"n":1}'
    assert len(await q.peek(1000)) == 4


async def test_peek_shows_undecodable_and_malformed_raw(client: Redis, make_queue: Any) -> None:
    q = make_queue(codec="json")
    raw_q = make_queue(codec="bytes")
    due = await raw_q.offer(b"\xffnot json", 100)
    await client.zadd(q.keys.timeout_set, {b"junk": int(due) + 1})
    undecodable, malformed = await q.peek(5)
    assert (undecodable.value, undecodable.raw, undecodable.decodable, undecodable.malformed) == (
        None, b"\xffnot json", False, False)
    assert (malformed.raw, malformed.malformed, malformed.due_ms) == (b"junk", True, int(due) + 1)


@pytest.mark.parametrize("limit", [0, 1001, -1, 2.0, True])
async def test_peek_rejects_a_bad_limit(make_queue: Any, limit: Any) -> None:
    with pytest.raises(ConfigurationError):
        await make_queue().peek(limit)


# -- paged walks (contains / read_all / remove page over the timeout zset) --------------------------


async def _zset(client: Redis, q: Any) -> list[tuple[bytes, float]]:
    return list(await client.zrange(q.keys.timeout_set, 0, -1, withscores=True))


async def test_walks_span_many_pages(client: Redis, make_queue: Any) -> None:
    q = make_queue()
    q._pending.page_size = 3
    delays = random.Random(1).sample(range(1000, 60000), 50)
    await q.offer_many([(i, d / 1000) for i, d in enumerate(delays)])
    by_due = [i for _, i in sorted((d, i) for i, d in enumerate(delays))]
    assert await q.read_all() == by_due
    assert await q.contains(by_due[-1])  # found on the last page
    assert not await q.contains(-1)  # a full walk
    assert await q.remove(by_due[-1])
    assert await q.remove_all([by_due[0], by_due[10], by_due[20]])
    assert await q.read_all() == [i for i in by_due[1:-1] if i not in (by_due[10], by_due[20])]


async def test_remove_takes_the_first_match_in_due_order(client: Redis, make_queue: Any) -> None:
    q = make_queue()
    q._pending.page_size = 2
    await q.offer_many([("x", 60), ("dup", 50), ("y", 60), ("dup", 10), ("dup", 30), ("z", 5)])
    before = {m: s for m, s in await _zset(client, q)}
    assert await q.remove("dup")
    after = {m: s for m, s in await _zset(client, q)}
    [(gone, score)] = [(m, s) for m, s in before.items() if m not in after]
    assert gone.endswith(b'"dup"')
    assert score == min(s for m, s in before.items() if m.endswith(b'"dup"'))  # the one due in 10 s
    assert await q.size() == 5
    assert await q.read_all() == ["z", "dup", "dup", "x", "y"]


async def test_remove_all_matches_across_pages_including_page_ends(client: Redis, make_queue: Any) -> None:
    q = make_queue()
    q._pending.page_size = 3
    items = [("a" if i % 3 == 2 else "b" if i % 5 == 0 else f"k{i}", 60 + i) for i in range(40)]
    await q.offer_many(items)
    # Every third element, a page's last one (its cursor), goes: the next page starts after a gone cursor.
    assert await q.remove_all(["a", "b", "missing"])
    assert await q.read_all() == [item for item, _ in items if item not in ("a", "b")]
    assert not await q.remove_all(["a", "b"])
    assert await client.llen(q.keys.delay_list) == 0


async def test_cursor_survives_removal_of_its_element_among_equal_scores(client: Redis, make_queue: Any) -> None:
    fast, strict = make_queue(codec="str"), make_queue(codec="str", strict=True)
    legacy = make_queue(codec="str", wire_format="redisson-legacy")
    for i in range(20):
        await fast.offer(f"f{i}", 60)
        await strict.offer(f"s{i}", 60)
        await legacy.offer(f"l{i}", 60)
    await fast.offer_many([("before", 30), ("after", 90)])
    members = await client.zrange(fast.keys.timeout_set, 0, -1)
    # 60 elements of three formats (random ids: member-byte order is unrelated to insertion) get one score.
    tied = [m for m in members if not m.endswith((b"before", b"after"))]
    await client.zadd(fast.keys.timeout_set, dict.fromkeys(tied, int(await server_ms(client)) + 60000), xx=True)
    ordered = await client.zrange(fast.keys.timeout_set, 0, -1)
    assert ordered[0].endswith(b"before")
    assert ordered[-1].endswith(b"after")
    payloads = [_payload_of(m) for m in ordered]
    # A walk of one element per page reports each element once, in zset order.
    fast._pending.page_size = 1
    assert await fast.read_all() == payloads
    # A page whose cursor element is gone starts at the first element after it.
    for i, m in enumerate(ordered):
        score = await client.zscore(fast.keys.timeout_set, m)
        await client.zrem(fast.keys.timeout_set, m)
        reply = await run_script(client, QueueScripts.read_page, [fast.keys.timeout_set, fast.keys.tier_index],
                                 [repr(score), m, 1000], timeout_s=5)
        assert [p.decode() for p in reply[2:]] == payloads[i + 1:], i
        await client.zadd(fast.keys.timeout_set, {m: score})


_KNOWN = {"before", "after"} | {f"{p}{i}" for p in "fsl" for i in range(20)}


def _payload_of(member: bytes) -> str:
    # The codec is "str": a member ends with its payload (none of these is a suffix of another).
    [payload] = [p for p in _KNOWN if member.endswith(p.encode()) and not any(
        q != p and q.endswith(p) and member.endswith(q.encode()) for q in _KNOWN)]
    return payload


@pytest.mark.parametrize("options", [{"strict": True}, {"wire_format": "redisson-legacy"}],
                         ids=["strict", "legacy"])
async def test_listed_elements_are_removed_from_zset_and_delay_list(client: Redis, make_queue: Any,
                                                                   options: dict[str, Any]) -> None:
    q = make_queue(codec="str", **options)
    fast = make_queue(codec="str")
    q._pending.page_size = 2
    await q.offer_many([(x, 60 + i) for i, x in enumerate(["a", "b", "c", "a", "d", "c", "e"])])
    await fast.offer_many([("a", 61.5), ("c", 70)])
    assert await client.llen(q.keys.delay_list) == 7

    async def keys_agree() -> None:
        listed = set(await client.lrange(q.keys.delay_list, 0, -1))
        zset = {m for m, _ in await _zset(client, q)}
        assert listed == {m for m in zset if not m.startswith(b"\x14adq\x01")}

    assert await q.remove("b")
    await keys_agree()
    assert await q.remove_all(["a", "c"])
    await keys_agree()
    assert await client.llen(q.keys.delay_list) == 2
    assert await q.read_all() == ["d", "e"]
    assert not await q.contains("a")


async def test_walks_are_correct_while_transfers_run(client: Redis, make_queue: Any) -> None:
    q = make_queue(codec="str", safety_poll_s=0.05)
    q._pending.page_size = 3
    rng = random.Random(5)
    soon = [f"s{i}" for i in range(300)]
    far = [f"far{i}" for i in range(40)]
    loop = asyncio.get_running_loop()
    offered_at = loop.time()
    await q.offer_many([(x, rng.uniform(0.05, 0.8)) for x in soon] + [(x, 60) for x in far])
    cancel_soon, cancel_far = rng.sample(soon, 60), far[::4]
    removed: dict[str, bool] = {}
    delivered: list[str] = []

    async def consume() -> None:
        while True:
            delivered.append(await q.take())

    async with q:
        consumer = loop.create_task(consume())
        try:
            batches = 0
            deadline = loop.time() + 0.9
            # Ten removals every 0.1 s between walks, timed from the offer rather than counted in
            # walks (a walk is ~340 round trips: a slow machine does few): the first batch before
            # any item is due, the last at 0.5 s when most have moved, so both outcomes happen.
            while loop.time() < deadline or batches < len(cancel_soon) // 10:
                while batches < len(cancel_soon) // 10 and loop.time() >= offered_at + 0.1 * batches:
                    for x in cancel_soon[10 * batches:10 * batches + 10]:
                        removed[x] = await q.remove(x)
                    batches += 1
                got = await q.read_all()
                assert len(got) == len(set(got)), "an element reported twice"
                assert set(got) <= set(soon) | set(far)
                assert set(far) - set(cancel_far) <= set(got)  # pending through the whole walk
                assert await q.contains(far[1])
                assert not await q.contains("absent")
            for x in cancel_far:
                removed[x] = await q.remove(x)
            await until(lambda: len(delivered) + sum(removed.values()) >= len(soon), timeout_s=10)
        finally:
            consumer.cancel()
    assert await client.llen(q.keys.destination) == 0  # no copy of anything left over, taken or not
    assert len(delivered) == len(set(delivered))
    for x in cancel_soon:  # each was either cancelled (True) or delivered, never both, never neither
        assert removed[x] != (x in delivered), x
    assert all(removed[x] for x in cancel_far)
    assert set(delivered) == set(soon) - {x for x in cancel_soon if removed[x]}
    assert 0 < sum(removed[x] for x in cancel_soon) < len(cancel_soon)  # both outcomes happened
    assert sorted(await q.read_all()) == sorted(set(far) - set(cancel_far))


async def test_a_resent_remove_page_reports_the_removal_it_made(own_server: Any, make_proxy: Any, make_client: Any,
                                                                 make_queue: Any) -> None:
    server = own_server()
    direct = make_client(server)
    proxy = make_proxy(server)
    q: DelayedQueue[str] = make_queue("lost-remove", redis=make_client(proxy), codec="str", call_timeout_s=5.0)
    await q.offer_many([("t", 60), ("t", 61), ("other", 62)] + [(f"x{i}", 63) for i in range(10)])
    await direct.script_load(QueueScripts.remove_page.text)  # so the killed call is the removal itself
    calls = await direct.zcard(q.keys.calls)
    proxy.kill_after_send(QueueScripts.remove_page.sha.encode())
    assert await q.remove("t") is True  # applied, reply lost, resent: still the truth
    assert proxy.killed == 1
    assert await q.read_all() == ["t", "other"] + [f"x{i}" for i in range(10)]  # exactly one went
    assert await direct.zcard(q.keys.calls) == calls + 1  # the page remembered its reply
    # A lost reply on every page of a multi-page remove_all: each page counted once.
    q._pending.page_size = 2
    await q.offer_many([("t", 64), ("t", 65)])
    proxy.kill_after_send(QueueScripts.remove_page.sha.encode(), times=4)
    assert await q._pending.remove(["t", "x3"], first_only=False) == 4
    assert proxy.killed == 5
    assert await q.read_all() == ["other"] + [f"x{i}" for i in range(10) if i != 3]
    # A resent page that found nothing reports nothing.
    proxy.kill_after_send(QueueScripts.remove_page.sha.encode())
    assert await q.remove("absent") is False
    assert proxy.killed == 6


async def test_malformed_elements_are_skipped_by_every_walk(client: Redis, make_queue: Any) -> None:
    q = make_queue(codec="str")
    q._pending.page_size = 2
    await q.offer_many([("a", 60), ("b", 61)])
    now = await server_ms(client)
    garbage = [b"", b"x", b"\x08" + b"\x00" * 20, os.urandom(64), b"\x14adq\x01" + b"\xff" * 30]
    await client.zadd(q.keys.timeout_set, {g: now + 60500 + i for i, g in enumerate(garbage)})
    assert await q.read_all() == ["a", "b"]
    assert await q.contains("b")
    assert not await q.remove("x")
    assert await q.remove_all(["a", "b"])
    assert await q.size() == len(garbage)


async def test_a_remove_page_runs_once_per_call_id(client: Redis, make_queue: Any) -> None:
    q = make_queue(codec="str")
    k = q.keys
    keys = [k.timeout_set, k.delay_list, k.calls, k.call_replies, k.tier_index, k.tier_count]
    await q.offer_many([("t", 60), ("t", 61)])

    async def page(call_id: bytes, resend: str) -> Any:
        return await run_script(client, QueueScripts.remove_page, keys, [call_id, "", "", 1000, "1", resend, "t"],
                                timeout_s=5)

    # A first attempt that removed one: its resend repeats the reply and removes nothing more.
    first = await page(b"A" * 16, "0")
    assert first[0] == 1
    assert await page(b"A" * 16, "1") == first
    assert await q.size() == 1
    # A resend that ran before its first attempt (which arrived late, on a dropped connection): the
    # late attempt repeats the resend's reply, whether that removed one or found nothing.
    assert (await page(b"B" * 16, "1"))[0] == 1
    await q.offer("t", 60)
    assert (await page(b"B" * 16, "0"))[0] == 1
    assert await q.size() == 1
    await q.clear()
    assert (await page(b"C" * 16, "1"))[0] == 0
    await q.offer("t", 60)
    assert (await page(b"C" * 16, "0"))[0] == 0
    assert await q.size() == 1
    # A first attempt that found nothing leaves no trace: a walk for an absent item writes nothing.
    calls = await client.zcard(k.calls)
    reply = await run_script(client, QueueScripts.remove_page, keys, [b"D" * 16, "", "", 1000, "1", "0", "x"],
                             timeout_s=5)
    assert reply[0] == 0
    assert await client.zcard(k.calls) == calls


# -- a million pending: every walk pages, one script call per page ----------------------------------------
# The walks page over the timeout zset: no script call reads more than a page, so none holds the server
# for long (how long a page takes, and what other clients see meanwhile, is measured by the benchmarks).

MILLION = 1_000_000


async def _load_a_million(q: DelayedQueue[str]) -> None:
    """A million fast elements through the producer (offer_many, 1000 per call, 8 calls in flight), due
    in an hour plus up to 10 minutes: about 1.7 per ms, so many share a score."""
    rng = random.Random(1)
    slots = asyncio.Semaphore(8)

    async def chunk(start: int) -> None:
        async with slots:
            await q.offer_many([(f"item-{i:07d}", 3600 + rng.random() * 600) for i in range(start, start + 1000)])

    await asyncio.gather(*(chunk(s) for s in range(0, MILLION, 1000)))


async def _script_calls(admin: Redis, walk: Awaitable[None]) -> int:
    """The script calls the server ran for ``walk``."""
    await admin.config_resetstat()
    await walk
    return int((await admin.info("commandstats"))["cmdstat_evalsha"]["calls"])


async def _false(result: Awaitable[bool]) -> None:
    assert await result is False


async def _count(result: Awaitable[list[Any]]) -> None:
    assert len(await result) == MILLION


@pytest.mark.slow
async def test_walks_over_a_million_pending_take_one_script_call_per_page(own_server: Any, make_client: Any,
                                                                          make_queue: Any) -> None:
    server = own_server()
    admin = make_client(server)
    q: DelayedQueue[str] = make_queue("scale", redis=make_client(server, max_connections=32), codec="str")
    await _load_a_million(q)
    assert await q.size() == MILLION
    for script in (QueueScripts.contains_page, QueueScripts.remove_page, QueueScripts.read_page):
        await admin.script_load(script.text)  # so that every call counted is a page, none a NOSCRIPT attempt
    pages = MILLION // PAGE_SIZE
    # contains and remove of an absent item, and read_all, visit every element, a page per call.
    assert await _script_calls(admin, _false(q.contains("absent"))) >= pages
    assert await _script_calls(admin, _false(q.remove("absent"))) >= pages
    assert await _script_calls(admin, _count(q.read_all())) >= pages
    assert await q.size() == MILLION
