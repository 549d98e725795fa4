"""The concurrency limit: at most N messages held by the reliable consumers of a queue together, in every
process, applied inside RECEIVE. What makes room (an ack, a nack, a deadline), what wakes a consumer it
held back (a published wake-up, no busy loop), how it meets pause, the rate limit, ``take`` and a
worker, and bad input refused with nothing written."""

from __future__ import annotations

import asyncio
import random
import time
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

from aiodelayq import ConfigurationError, DelayedQueue
from tests.helpers import receivers_waiting, script_calls, until


async def test_consumers_on_three_clients_never_hold_more_than_the_limit_together(
        client: Redis, make_client: Any, make_queue: Any) -> None:
    limit, n = 5, 90
    queues: list[DelayedQueue[int]] = [make_queue(), make_queue(redis=make_client()), make_queue(redis=make_client())]
    await queues[0].set_concurrency_limit(limit)
    await queues[0].offer_many([(i, 0) for i in range(n)])
    held, most, got = 0, 0, []

    async def consume(q: DelayedQueue[int]) -> None:
        nonlocal held, most
        while True:
            messages = await q.receive_many(10, 30)
            held += len(messages)  # counted from its return: Redis counted them first
            most = max(most, held)
            await asyncio.sleep(random.uniform(0, 0.01))
            for m in messages:
                got.append(m.value)
                held -= 1  # before the ack lands: Redis frees the room later
                assert await m.ack()

    async with queues[0], queues[1], queues[2]:
        consumers = [asyncio.create_task(consume(q)) for q in queues]
        await until(lambda: len(got) >= n, timeout_s=30)  # does not hang: a second or so expected
        for task in consumers:
            task.cancel()
        await asyncio.gather(*consumers, return_exceptions=True)
    assert sorted(got) == list(range(n))  # none lost, none doubled
    assert most <= limit
    assert (await queues[0].counts()).concurrency_limit == limit


async def test_an_ack_or_a_nack_wakes_a_consumer_held_back_and_waiting_costs_no_calls(
        client: Redis, make_client: Any, make_queue: Any) -> None:
    one: DelayedQueue[int] = make_queue(safety_poll_s=300)  # only a wake-up ends a wait
    two: DelayedQueue[int] = make_queue(redis=make_client(), safety_poll_s=300)
    await one.set_concurrency_limit(2)
    await one.offer_many([(i, 0) for i in range(6)])
    async with one, two:
        first = await one.receive_many(10, 30, timeout=5)
        assert len(first) == 2  # the limit, not the 10 asked for
        waiting = asyncio.create_task(two.receive(30))
        await until(lambda: receivers_waiting(two))
        if not isinstance(client, RedisCluster):
            before, started = await script_calls(client), time.monotonic()
            await asyncio.sleep(1.0)
            calls, elapsed = await script_calls(client) - before, time.monotonic() - started
            assert calls <= 2 * elapsed + 2, calls  # no busy loop: none is due, nothing wakes it
        assert not waiting.done()
        assert await first[0].ack()
        woken = await asyncio.wait_for(waiting, 10)  # does not hang: one wake-up expected
        assert woken is not None
        # A nack with a delay makes room too: the message waits out its delay, not counted.
        assert await first[1].nack(60)
        third = await two.receive(30, timeout=10)
        assert third is not None
        assert third.value not in (first[1].value, woken.value)
        assert await two.receive(30, timeout=0.2) is None  # two held: full again
        counts = await one.counts()
        assert counts.in_flight == 3  # the nacked one waits in flight, not held


async def test_raising_or_removing_the_limit_restarts_delivery_at_once(make_client: Any, make_queue: Any) -> None:
    one: DelayedQueue[int] = make_queue(safety_poll_s=300)
    two: DelayedQueue[int] = make_queue(redis=make_client(), safety_poll_s=300)
    await one.set_concurrency_limit(1)
    await one.offer_many([(i, 0) for i in range(5)])
    async with one, two:
        held = await one.receive_many(5, 30, timeout=5)
        assert len(held) == 1
        waiting = asyncio.create_task(two.receive_many(5, 30))
        await until(lambda: receivers_waiting(two))
        await one.set_concurrency_limit(3)  # publishes: the waiting consumer looks again
        assert len(await asyncio.wait_for(waiting, 10)) == 2
        waiting = asyncio.create_task(two.receive_many(5, 30))
        await until(lambda: receivers_waiting(two))
        await one.set_concurrency_limit(None)
        assert len(await asyncio.wait_for(waiting, 10)) == 2
        assert (await one.counts()).concurrency_limit is None


async def test_a_message_past_its_visibility_timeout_is_not_held_and_comes_back_first(make_client: Any,
                                                                                       make_queue: Any) -> None:
    # Its consumer is gone (it never acks): after the deadline the room is free again, and the
    # message is the next one delivered, with its count raised.
    one: DelayedQueue[int] = make_queue()
    two: DelayedQueue[int] = make_queue(redis=make_client())
    await one.set_concurrency_limit(1)
    await one.offer_many([(i, 0) for i in range(3)])
    async with one, two:
        [lost] = await one.receive_many(3, 0.3, timeout=5)
        again = await two.receive(30, timeout=10)
        assert again is not None
        assert (again.value, again.delivery_count) == (lost.value, 2)
        assert not await lost.ack()  # no longer in flight as that delivery


async def test_take_is_not_counted_and_pause_and_the_rate_limit_still_hold(make_queue: Any) -> None:
    q: DelayedQueue[int] = make_queue()
    await q.set_concurrency_limit(1)
    await q.offer_many([(i, 0) for i in range(8)])
    async with q:
        [held] = await q.receive_many(5, 30, timeout=5)
        assert len(await q.take_many(3, timeout=5)) == 3  # take holds nothing: the limit does not apply
        await held.ack()
        await q.pause()  # room, but paused: nothing
        assert await q.receive(30, timeout=0.6) is None
        await q.resume()
        await q.set_rate_limit(2, burst=1)  # room for 1 and a token: one now, then the bucket's pace
        started = time.monotonic()
        first = await q.receive(30, timeout=5)
        assert first is not None
        assert await q.receive(30, timeout=0.2) is None  # the limit: one held
        await first.ack()
        second = await q.receive(30, timeout=5)
        assert second is not None
        assert time.monotonic() - started >= 0.4  # the second token came after ~0.5 s
        await second.ack()


async def test_workers_in_two_clients_run_at_most_the_limit_of_handlers_at_once(make_client: Any,
                                                                                 make_queue: Any) -> None:
    limit, n = 4, 60
    one: DelayedQueue[int] = make_queue()
    two: DelayedQueue[int] = make_queue(redis=make_client())
    await one.set_concurrency_limit(limit)
    await one.offer_many([(i, 0) for i in range(n)])
    running, most, done = 0, 0, []

    async def handle(item: int) -> None:
        nonlocal running, most
        running += 1
        most = max(most, running)
        await asyncio.sleep(0.005)
        running -= 1
        done.append(item)

    async with one, two:
        workers = [q.worker(handle, concurrency=8, reliable=True) for q in (one, two)]
        runs = [asyncio.create_task(w.run()) for w in workers]
        await until(lambda: len(done) >= n, timeout_s=30)
        for w in workers:
            w.stop()
        await asyncio.gather(*runs)
    assert sorted(done) == list(range(n))
    assert most <= limit


@pytest.mark.parametrize("limit", [0, -1, 1.5, True, "3"])
async def test_a_bad_concurrency_limit_names_its_option_and_writes_nothing(make_queue: Any, client: Redis,
                                                                           limit: Any) -> None:
    q: DelayedQueue[int] = make_queue()
    with pytest.raises(ConfigurationError, match="limit"):
        await q.set_concurrency_limit(limit)
    assert await client.exists(q.keys.controls) == 0
