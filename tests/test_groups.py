"""Ordered groups: a group's items handed out in order, at most ``group_concurrency`` of them in flight
across every consumer, groups taking turns; with keys, ``take``, the concurrency limit, and bad input
refused with nothing written. Java's keys never hold a grouped item."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import textwrap
from typing import Any

import pytest
from redis.asyncio import Redis

from aiodelayq import (
    ConfigurationError,
    DelayedQueue,
    InvalidGroupError,
    InvalidKeyError,
    QueueFullError,
    current_message,
)
from tests.helpers import first_line, receivers_waiting, until


async def test_two_workers_handle_each_group_in_order_and_one_at_a_time(make_client: Any, make_queue: Any) -> None:
    groups, per_group = 20, 50
    queues: list[DelayedQueue[str]] = [make_queue(), make_queue(redis=make_client())]
    items = [(f"{g}:{i}", 0) for i in range(per_group) for g in range(groups)]
    await queues[0].offer_many(items, groups=[f"g{i.split(':')[0]}" for i, _ in items])
    events: list[tuple[str, str, int]] = []  # (start|end, group, index)
    done: list[str] = []

    async def handle(value: str) -> None:
        group, index = value.split(":")
        message = current_message()
        assert message is not None
        assert message.group == f"g{group}"
        events.append(("start", group, int(index)))
        await asyncio.sleep(random.uniform(0, 0.003))
        events.append(("end", group, int(index)))
        done.append(value)

    workers = [q.worker(handle, concurrency=8) for q in queues]
    async with queues[0], queues[1]:
        running = [asyncio.create_task(w.run()) for w in workers]
        await until(lambda: len(done) >= groups * per_group, timeout_s=60)  # does not hang: a few s expected
        for w in workers:
            w.stop()
        await asyncio.gather(*running)
    assert sorted(done) == sorted(item for item, _ in items)  # every item exactly once
    running_now: dict[str, int] = {}
    seen: dict[str, list[int]] = {}
    for kind, group, index in events:
        if kind == "start":
            assert group not in running_now, f"group {group}: {index} started while {running_now[group]} ran"
            running_now[group] = index
            seen.setdefault(group, []).append(index)
        else:
            del running_now[group]
    assert all(order == list(range(per_group)) for order in seen.values())  # offer order, per group
    await until(lambda: _settled(queues[0]), timeout_s=10)  # the last acks are written behind


async def _settled(q: DelayedQueue[Any]) -> bool:
    counts = await q.counts()
    return (counts.ready, counts.in_flight, counts.groups) == (0, 0, 0)


async def test_a_nack_and_an_expired_timeout_keep_the_group_first(make_queue: Any) -> None:
    q: DelayedQueue[int] = make_queue()
    await q.offer_many([(i, 0) for i in range(3)], groups=["g"] * 3)
    async with q:
        first = await q.receive(0.3, timeout=5)
        assert first is not None
        assert first.value == 0
        assert await q.receive(30, timeout=0.1) is None  # the group's one message is in flight
        again = await q.receive(30, timeout=5)  # its visibility timeout ends: it comes back first
        assert again is not None
        assert (again.value, again.delivery_count) == (0, 2)
        assert await again.nack()
        third = await q.receive(30, timeout=5)
        assert third is not None
        assert (third.value, third.delivery_count) == (0, 3)
        assert await third.ack()
        nxt = await q.receive(30, timeout=5)
        assert nxt is not None
        assert nxt.value == 1
        assert await nxt.nack(dead_letter=True)
        last = await q.receive(30, timeout=5)
        assert last is not None
        assert last.value == 2


async def test_a_hot_group_does_not_hold_back_the_cold_ones(make_client: Any, make_queue: Any) -> None:
    # The measure: a hot group of 10,000 items and 100 groups of 1, all due at once, two
    # reliable workers with a 1 ms handler: every cold item is handed out before the hot group's 200th.
    queues: list[DelayedQueue[str]] = [make_queue(), make_queue(redis=make_client())]
    items = [(f"hot:{i}", 0) for i in range(10_000)] + [(f"cold{i}:0", 0) for i in range(100)]
    await queues[0].offer_many(items, groups=[item.split(":")[0] for item, _ in items])
    order: list[str] = []

    async def handle(value: str) -> None:
        order.append(value)
        await asyncio.sleep(0.001)

    workers = [q.worker(handle, concurrency=16) for q in queues]
    async with queues[0], queues[1]:
        running = [asyncio.create_task(w.run()) for w in workers]
        await until(lambda: sum(v.startswith("cold") for v in order) == 100, timeout_s=60)
        for w in workers:
            w.stop()
        await asyncio.gather(*running)
    last_cold = max(i for i, v in enumerate(order) if v.startswith("cold"))
    hot_before = sum(v.startswith("hot") for v in order[:last_cold])
    assert hot_before < 200, hot_before


async def test_an_ack_hands_the_group_on_to_a_receiver_elsewhere_without_a_transfer(
        make_client: Any, make_queue: Any) -> None:
    # The ack's wake-up says nothing fell due: the other process's receiver looks again, and neither
    # process runs a transfer for it.
    one: DelayedQueue[int] = make_queue(safety_poll_s=300)
    two: DelayedQueue[int] = make_queue(redis=make_client(), safety_poll_s=300)
    await one.offer_many([(0, 0), (1, 0)], groups=["g", "g"])
    async with one, two:
        first = await one.receive(30, timeout=5)
        assert first is not None
        assert first.value == 0
        waiting = asyncio.create_task(two.receive(30))
        await until(lambda: receivers_waiting(two))
        transfers = one.stats.transfers + two.stats.transfers
        assert await first.ack()
        second = await asyncio.wait_for(waiting, 10)  # does not hang: one wake-up expected
        assert second is not None
        assert second.value == 1
        assert one.stats.transfers + two.stats.transfers == transfers


async def test_take_hands_each_group_out_in_order(make_queue: Any) -> None:
    q: DelayedQueue[str] = make_queue()
    items = [(f"{g}:{i}", 0) for i in range(30) for g in "abc"]
    await q.offer_many(items, groups=[item[0] for item, _ in items])
    got: list[str] = []
    async with q:
        while len(got) < len(items):
            got += await q.take_many(7, timeout=5)
    for g in "abc":
        assert [v for v in got if v[0] == g] == [f"{g}:{i}" for i in range(30)]
    assert (await q.counts()).groups == 0


async def test_an_ack_carried_twice_in_one_call_makes_room_for_one(client: Redis, make_queue: Any) -> None:
    # The same ack twice in one RECEIVE (acks written behind are carried by it) settles one message:
    # its group, at its limit of two, admits one more item, not two.
    q: DelayedQueue[str] = make_queue(codec="str")
    async with q:
        await q.set_group_concurrency(2)
        await q.offer_many([(v, 0) for v in "abcd"], groups=["g"] * 4)
        held = await q.receive_many(2, 30, timeout=5)
        assert [m.value for m in held] == ["a", "b"]
        scripts = q._life.reliable()._scripts
        twice = [held[0]._element] * 2
        reply = await scripts.receive.resend(10, 30_000, 0, os.urandom(16), *twice, durable=True)
        assert int(reply[6]) == 1  # one ack applied
        assert len(reply[7]) == 1  # "c"
        assert await client.llen(q.keys.group_ready) == 0
        assert await client.llen(q.keys.group_list("g")) == 1  # "d" waits for room
        assert await held[1].ack(confirm=True)
        assert [m.value for m in await q.receive_many(10, 30, timeout=5)] == ["d"]


async def test_grouped_items_wait_where_java_does_not_look(client: Redis, make_queue: Any) -> None:
    q: DelayedQueue[str] = make_queue()
    await q.offer("grouped", 0, group="g")
    await q.offer("later", 60, group="g")
    k = q.keys
    assert await client.zcard(k.timeout_set) == 0
    assert await client.zcard(k.grouped) == 2
    async with q:
        await until(lambda: client.llen(k.group_ready))  # admitted: the group has room
        assert await client.llen(k.destination) == 0  # Java's consumers BLPOP it: never a grouped item
        assert await q.size() == 1
        counts = await q.counts()
        assert (counts.pending, counts.ready, counts.groups) == (1, 1, 1)
        m = await q.receive(30, timeout=5)
        assert m is not None
        assert (m.value, m.group) == ("grouped", "g")


async def test_a_raised_group_limit_hands_out_more_of_a_group_at_once(make_queue: Any) -> None:
    q: DelayedQueue[int] = make_queue()
    await q.offer_many([(i, 0) for i in range(6)], groups=["g"] * 6)
    async with q:
        first = await q.receive_many(10, 30, timeout=5)
        assert [m.value for m in first] == [0]
        waiting = asyncio.create_task(q.receive_many(10, 30))
        await asyncio.sleep(0.1)
        await q.set_group_concurrency(3)  # publishes: the waiting consumer looks again at once
        more = await asyncio.wait_for(waiting, 10)
        assert [m.value for m in more] == [1, 2]
        assert (await q.counts()).group_concurrency == 3
        await q.set_group_concurrency(1)  # lowering takes nothing back
        for m in first + more:
            assert await m.ack()
        last = await q.receive_many(10, 30, timeout=5)
        assert [m.value for m in last] == [3]


async def test_a_lowered_group_limit_holds_until_a_raise_admits_again(client: Redis, make_queue: Any) -> None:
    q: DelayedQueue[int] = make_queue()
    async with q:
        await q.set_group_concurrency(3)
        await q.offer_many([(i, 0) for i in range(6)], groups=["g"] * 6)
        held = await q.receive_many(10, 30, timeout=5)
        assert [m.value for m in held] == [0, 1, 2]
        await q.set_group_concurrency(1)
        for m in held[:2]:
            assert await m.ack(confirm=True)
        # One still in flight fills the lowered limit: nothing admitted, the rest wait in the group's list.
        assert await client.llen(q.keys.group_ready) == 0
        assert await client.llen(q.keys.group_list("g")) == 3
        await q.set_group_concurrency(2)
        assert [m.value for m in await q.receive_many(10, 30, timeout=5)] == [3]
        assert await client.llen(q.keys.group_list("g")) == 2


async def test_the_concurrency_limit_holds_with_groups(make_queue: Any) -> None:
    q: DelayedQueue[int] = make_queue()
    await q.set_concurrency_limit(2)
    await q.offer_many([(i, 0) for i in range(10)], groups=[f"g{i % 5}" for i in range(10)])
    async with q:
        held = await q.receive_many(10, 30, timeout=5)
        assert len(held) == 2
        assert await q.receive_many(10, 30, timeout=0.2) == []
        assert await held[0].ack()
        nxt = await q.receive_many(10, 30, timeout=5)
        assert len(nxt) == 1


async def test_a_keyed_grouped_item_is_found_by_its_key(make_queue: Any) -> None:
    q: DelayedQueue[str] = make_queue()
    first = await q.offer("a", 60, key="k", group="g")
    assert first.added
    again = await q.offer("b", 60, key="k")  # the key is taken, whatever the group
    assert not again.added
    assert again == first
    pending = await q.get("k")
    assert pending is not None
    assert pending.value == "a"
    assert pending.group == "g"
    assert await q.reschedule("k", 0) is not None
    async with q:
        m = await q.receive(30, timeout=5)
        assert m is not None
        assert (m.value, m.group) == ("a", "g")
    await q.offer("c", 60, key="k2", group="g")
    assert await q.cancel("k2")
    assert await q.size() == 0


@pytest.mark.parametrize("group", ["", "x" * 257, 5, "\ud800"])
async def test_a_bad_group_writes_nothing(client: Redis, make_queue: Any, group: Any) -> None:
    q: DelayedQueue[str] = make_queue()
    with pytest.raises(InvalidGroupError, match="group"):
        await q.offer("a", 0, group=group)
    with pytest.raises(InvalidKeyError):  # (a subclass)
        await q.offer_many([("a", 0), ("b", 0)], groups=["ok", group])
    assert not await client.exists(*q.keys.all)


async def test_groups_are_refused_where_java_must_see_the_elements(client: Redis, make_queue: Any) -> None:
    strict: DelayedQueue[str] = make_queue(strict=True)
    with pytest.raises(InvalidGroupError, match="strict"):
        await strict.offer("a", 0, group="g")
    legacy: DelayedQueue[str] = make_queue(name=f"{strict.name}-legacy", wire_format="redisson-legacy")
    with pytest.raises(InvalidGroupError, match="legacy"):
        await legacy.offer_many([("a", 0)], groups=["g"])
    assert not await client.exists(*legacy.keys.all)
    q: DelayedQueue[str] = make_queue()
    with pytest.raises(InvalidGroupError, match="one group"):
        await q.offer_many([("a", 0), ("b", 0)], groups=["g"])
    with pytest.raises(ConfigurationError, match="limit"):
        await q.set_group_concurrency(0)
    with pytest.raises(ConfigurationError, match="limit"):
        await q.set_group_concurrency(1_000_001)
    assert not await client.exists(*q.keys.all)


async def test_messages_given_back_and_dead_letters_requeued_keep_their_group(make_queue: Any) -> None:
    q: DelayedQueue[int] = make_queue()
    await q.offer_many([(i, 0) for i in range(3)], groups=["g"] * 3)
    async with q:
        first = await q.receive(30, timeout=5)
        assert first is not None
        assert first.value == 0
        assert await first.release()  # nobody saw it: back to the head of its group
        again = await q.receive(30, timeout=5)
        assert again is not None
        assert (again.value, again.delivery_count) == (0, 1)
        assert await again.nack(dead_letter=True)
        assert await q.requeue_dead_letters() == 1  # behind the group's due items, in the group
        got = []
        while len(got) < 3:
            m = await q.receive(30, timeout=5)
            assert m is not None
            assert m.group == "g"
            got.append(m.value)
            assert await m.ack()
    assert got == [1, 2, 0]
    counts = await q.counts()
    assert (counts.pending, counts.ready, counts.in_flight, counts.groups) == (0, 0, 0, 0)


HOLDER = textwrap.dedent("""
    import asyncio, sys
    from redis.asyncio import Redis
    from aiodelayq import DelayedQueue

    async def main(url, name):
        async with DelayedQueue(Redis.from_url(url), name) as q:
            held = await q.receive_many(10, visibility_timeout=1.0, timeout=10)
            print(",".join(m.value for m in held), flush=True)
            await asyncio.sleep(60)  # never acks: the test kills this process

    asyncio.run(main(sys.argv[1], sys.argv[2]))
""")


async def test_a_group_goes_on_in_order_after_its_consumer_is_killed(redis_server: Any, make_queue: Any,
                                                                     qname: str, spawn_consumer: Any) -> None:
    q: DelayedQueue[str] = make_queue()
    await q.offer_many([(f"{g}{i}", 0) for i in range(3) for g in "ab"], groups=[g for _ in range(3) for g in "ab"])
    child = spawn_consumer(HOLDER, args=[redis_server.url, qname])
    assert sorted((await first_line(child)).strip().split(",")) == ["a0", "b0"]  # one of each group
    child.send_signal(signal.SIGKILL)
    await child.await_exit(10)
    got: list[tuple[str, int]] = []
    async with q:
        while len(got) < 6:
            m = await q.receive(30, timeout=10)  # the first after the dead one's visibility timeout
            assert m is not None
            got.append((m.value, m.delivery_count))
            assert await m.ack()
    for g in "ab":
        assert [entry for entry in got if entry[0][0] == g] == [(f"{g}0", 2), (f"{g}1", 1), (f"{g}2", 1)]


async def test_grouped_items_count_under_capacity_and_are_never_tiered(client: Redis, make_queue: Any) -> None:
    q: DelayedQueue[int] = make_queue(capacity=3, tier_after_s=60)
    await q.offer_many([(1, 3600), (2, 0)], groups=["g", "g"])  # far ahead, yet in the grouped zset
    await q.offer(3, 3600)
    with pytest.raises(QueueFullError):
        await q.offer(4, 0, group="h")
    assert await client.zcard(q.keys.grouped) == 2
    assert (await q.counts()).pending == 3
