"""Reliable (at-least-once) consumption: receive, ack, nack, visibility timeout, max deliveries."""

from __future__ import annotations

import asyncio
import random
import signal
import textwrap
from typing import Any

import pytest
from redis.asyncio import Redis

from aiodelayq import DelayedQueue, Message
from tests.helpers import first_line, server_ms, until


async def test_receive_then_ack_removes_for_good(client: Redis, make_queue: Any) -> None:
    q = make_queue()
    await q.offer({"order": 1}, 0)
    async with q:
        msg = await q.receive(visibility_timeout=30, timeout=5)
        assert isinstance(msg, Message)
        assert msg.value == {"order": 1}
        assert msg.delivery_count == 1
        assert msg.due_ms is None
        assert await client.zcard(q.keys.in_flight) == 1
        assert await msg.ack(confirm=True)
        assert not await msg.ack(confirm=True)
        assert await client.zcard(q.keys.in_flight) == 0
        assert await q.receive(visibility_timeout=0.1, timeout=0.3) is None


async def test_unacked_message_is_redelivered_after_its_visibility_timeout(client: Redis, make_queue: Any) -> None:
    q = make_queue()
    await q.offer("job", 0)
    async with q:
        loop = asyncio.get_running_loop()
        start = loop.time()  # before the first receive: its timeout starts later, however slow the reply
        first = await q.receive(visibility_timeout=0.3, timeout=5)
        assert first is not None
        second = await q.receive(visibility_timeout=30, timeout=5)
        assert second is not None
        assert loop.time() - start >= 0.25
        assert (second.value, second.id, second.delivery_count) == ("job", first.id, 2)
        assert second.due_ms is not None
        assert second.due_ms <= await server_ms(client)
        assert not await first.ack()  # the first holder lost it when its timeout ended
        assert await second.ack()


async def test_nack_redelivers_after_the_delay_and_counts(make_queue: Any) -> None:
    q = make_queue()
    await q.offer("job", 0)
    async with q:
        msg = await q.receive(visibility_timeout=30, timeout=5)
        assert msg is not None
        assert await msg.nack(delay=1.0)
        assert await q.receive(visibility_timeout=30, timeout=0.2) is None
        again = await q.receive(visibility_timeout=30, timeout=5)
        assert again is not None
        assert again.delivery_count == 2
        assert await again.ack()


async def test_past_max_deliveries_goes_to_dead_letters(make_queue: Any) -> None:
    q = make_queue(max_deliveries=2)
    await q.offer("poison", 0)
    async with q:
        for expected in (1, 2):
            msg = await q.receive(visibility_timeout=30, timeout=5)
            assert msg is not None
            assert msg.delivery_count == expected
            await msg.nack()
        assert await q.receive(visibility_timeout=30, timeout=0.3) is None
    [letter] = await q.dead_letters()
    assert (letter.value, letter.raw) == ("poison", b'"poison"')
    assert (letter.reason, letter.delivery_count) == ("max_deliveries", 2)
    assert letter.dead_at_ms is not None


async def test_messages_iterator_and_plain_take_side_by_side(make_queue: Any) -> None:
    q = make_queue()
    await q.offer_many([(i, 0) for i in range(10)])
    got: list[int] = []
    async with q:
        async for msg in q.messages(visibility_timeout=30):
            got.append(msg.value)
            await msg.ack()
            if len(got) == 5:
                break
        got.extend([await q.take() for _ in range(5)])
    assert sorted(got) == list(range(10))


async def test_cancelled_receives_lose_nothing(client: Redis, make_queue: Any) -> None:
    n = 200
    q = make_queue()
    await q.offer_many([(i, random.uniform(0, 0.3)) for i in range(n)])
    acked: set[int] = set()
    rng = random.Random(3)
    async with q:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 20
        while len(acked) < n and loop.time() < deadline:
            try:
                msgs = await asyncio.wait_for(q.receive_many(rng.randint(1, 5), 30), rng.choice([0.0005, 0.002, 0.5]))
            except asyncio.TimeoutError:
                continue
            for msg in msgs:
                await msg.ack()
                acked.add(msg.value)
    assert acked == set(range(n))
    assert await client.zcard(q.keys.in_flight) == 0


CONSUMER = textwrap.dedent("""
    import asyncio, sys
    from redis.asyncio import Redis
    from aiodelayq import DelayedQueue

    async def main(url, name):
        client = Redis.from_url(url)
        async with DelayedQueue(client, name) as q:
            held = await q.receive_many(10, visibility_timeout=1.0, timeout=10)
            print(len(held), flush=True)
            await asyncio.sleep(60)  # never acks: the test kills this process

    asyncio.run(main(sys.argv[1], sys.argv[2]))
""")


async def test_messages_of_a_killed_consumer_are_redelivered(redis_server: Any, make_queue: Any,
                                                            qname: str, spawn_consumer: Any) -> None:
    q = make_queue()
    await q.offer_many([(i, 0) for i in range(10)])
    child = spawn_consumer(CONSUMER, args=[redis_server.url, qname])
    assert (await first_line(child)).strip() == "10"
    child.send_signal(signal.SIGKILL)  # holding its 10 messages, never acking
    await child.await_exit(10)
    async with q:
        got = []
        while len(got) < 10:
            msgs = await q.receive_many(10, visibility_timeout=30, timeout=5)
            assert msgs, "held messages were not redelivered"
            for msg in msgs:
                assert msg.delivery_count == 2
                await msg.ack()
                got.append(msg.value)
    assert sorted(got) == list(range(10))


async def test_aclose_wakes_a_waiting_receive(make_queue: Any) -> None:
    from aiodelayq import QueueClosedError

    q = make_queue()
    await q.open()
    waiting = asyncio.create_task(q.receive(visibility_timeout=30))
    await asyncio.sleep(0.05)
    await q.aclose()
    with pytest.raises(QueueClosedError):
        await asyncio.wait_for(waiting, 3)


def test_bad_reliable_options(client: Redis) -> None:
    from aiodelayq import ConfigurationError

    with pytest.raises(ConfigurationError):
        DelayedQueue(client, "q", max_deliveries=0)


async def test_garbage_in_the_in_flight_zset_is_moved_aside(client: Redis, make_queue: Any) -> None:
    q = make_queue()
    await client.zadd(q.keys.in_flight, {b"junk": 0, b"adq\x02short": 0, b"x" * 40: 0})
    await q.offer("real", 0)
    async with q:
        msg = await q.receive(visibility_timeout=30, timeout=5)
        assert msg is not None
        assert msg.value == "real"
    letters = await q.dead_letters()
    assert sorted(d.raw for d in letters) == sorted([b"junk", b"adq\x02short", b"x" * 40])
    assert {d.reason for d in letters} == {"malformed"}


async def test_undecodable_message_is_dead_lettered_atomically(client: Redis, make_queue: Any) -> None:
    q = make_queue()
    await client.rpush(q.keys.destination, b"{not json", b'"ok"')
    async with q:
        msgs = await q.receive_many(2, visibility_timeout=30, timeout=5)
        assert [m.value for m in msgs] == ["ok"]
        assert await msgs[0].ack()
    [letter] = await q.dead_letters()
    assert (letter.raw, letter.reason) == (b"{not json", "undecodable")
    assert (letter.delivery_count, letter.decodable) == (1, False)
    assert await client.zcard(q.keys.in_flight) == 0


async def test_a_receive_cancelled_mid_call_costs_no_delivery(client: Redis, make_queue: Any) -> None:
    q = make_queue(max_deliveries=1)
    async with q:
        for steps in range(1, 15):
            await q.offer(f"item-{steps}", 0)
            await until_ready(q)
            task = asyncio.create_task(q.receive(visibility_timeout=30))
            for _ in range(steps):
                await asyncio.sleep(0)
            task.cancel()
            try:
                msg = await task
            except asyncio.CancelledError:
                msg = None
            if msg is None:  # cancelled: the item must be back, as a first delivery
                msg = await q.receive(visibility_timeout=30, timeout=5)
            assert msg is not None
            assert msg.value == f"item-{steps}"
            assert msg.delivery_count == 1
            assert await msg.ack()
    assert await q.dead_letters() == []


async def until_ready(q: DelayedQueue[Any]) -> None:
    await until(q.ready_size, timeout_s=5)


# -- wake-ups: a receiver that found nothing looks again as soon as something is visible ------------
# safety_poll_s=300 and a 30 s visibility timeout leave a waiting receiver only its 5 s recheck; each
# receive below is given 3 s, so it gets its message only through the wake-up under test. (Not
# receive(timeout=3): a receive whose timeout ran out asks Redis once more before it returns.)


async def _parked(q: DelayedQueue[Any]) -> asyncio.Task[Message[Any] | None]:
    """A receive of ``q`` that asked Redis, found nothing and now waits for a wake-up; it fails
    with TimeoutError after 3 s."""
    receiver = asyncio.create_task(asyncio.wait_for(q.receive(visibility_timeout=30), 3))
    await until(lambda: q._life.reliable().waiting == 1, timeout_s=3)
    return receiver


@pytest.mark.parametrize("elsewhere", [False, True], ids=["same-queue", "other-process"])
async def test_a_released_prefetch_wakes_a_receiver_that_found_nothing(make_client: Any, make_queue: Any,
                                                                        elsewhere: bool) -> None:
    # A receiver that asks Redis before a release of prefetched messages lands finds nothing; the
    # release must wake it (docs/reliable.md's program waited for another message's 0.5 s retry),
    # on the same queue object (the settler's callback) or another process's (SETTLE publishes).
    here = make_queue(safety_poll_s=300)
    there = make_queue(redis=make_client(), safety_poll_s=300) if elsewhere else here
    await here.offer_many([("a", 0), ("b", 0)])
    async with here, there:
        a, b = await here.receive_many(2, visibility_timeout=30, timeout=5)
        receiver = await _parked(there)
        here._life.reliable()._release_unclaimed([b])  # as the prefetch hold does for nobody's messages
        got = await receiver
        assert got is not None
        assert (got.value, got.delivery_count) == ("b", 1)
        assert await a.ack(confirm=True)
        assert await got.ack(confirm=True)


async def test_a_nack_in_one_process_wakes_a_receiver_in_another_when_due(make_client: Any, make_queue: Any) -> None:
    # The nack's due time is published; the other process's transfer at that time finds the
    # destination empty (the message is in the in-flight zset) and must wake its receivers anyway.
    here = make_queue(safety_poll_s=300)
    there = make_queue(redis=make_client(), safety_poll_s=300)
    await here.offer("a", 0)
    async with here, there:
        a = await here.receive(visibility_timeout=30, timeout=5)
        assert a is not None
        receiver = await _parked(there)
        assert await a.nack(delay=0.2)
        got = await receiver
        assert got is not None
        assert (got.value, got.delivery_count) == ("a", 2)
        assert await got.ack(confirm=True)
