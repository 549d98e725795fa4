"""Reliable (at-least-once) consumption: receive, receive_many and messages(); ack, nack and the
visibility timeout; max deliveries; waiting receivers woken when something becomes visible; acks and
receives at batch speed (prefetched receives, acks written behind); leases and extend(); resends after
lost replies; and several consumer processes acking a steady stream of due items."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import random
import signal
import textwrap
import time
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.backoff import ConstantBackoff

import aiodelayq._redis.backoff as backoff_module
from aiodelayq import BackendError, DelayedQueue, InvalidDelayError, Message
from aiodelayq._consuming.prefetch import MAX_PREFETCH
from aiodelayq._scripts import QueueScripts
from tests.helpers import first_line, llen_is, open_with_ready, server_clock_at, server_ms, server_past, until

# -- receive, ack, nack, redelivery --------------------------------------------------------------------


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
        assert not await first.extend(30)  # the first holder lost it when its timeout ended: no extending
        assert not await first.ack()  # and no acking
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


async def test_the_last_allowed_delivery_nacked_is_dead_lettered_at_once(client: Redis, make_queue: Any) -> None:
    q = make_queue(max_deliveries=2)
    await q.offer("poison", 0)
    async with q:
        for expected in (1, 2):
            msg = await q.receive(visibility_timeout=30, timeout=5)
            assert msg is not None
            assert msg.delivery_count == expected
            assert await msg.nack() is True
        # At once: the second nack moved it, with no further receive.
        [letter] = await q.dead_letters()
        assert (letter.value, letter.raw) == ("poison", b'"poison"')
        assert (letter.reason, letter.delivery_count) == ("max_deliveries", 2)
        assert letter.dead_at_ms is not None
        assert await client.zcard(q.keys.in_flight) == 0
        assert q.stats.exhausted == 1
        assert await q.receive(visibility_timeout=30, timeout=0.3) is None


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
    # release must wake it (or it waits for its 5 s recheck), on the same queue object (the
    # settler's callback) or another process's (SETTLE publishes).
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


@pytest.mark.parametrize("elsewhere", [False, True], ids=["same-queue", "other-process"])
async def test_an_undone_receive_wakes_a_receiver_that_found_nothing(client: Redis, make_client: Any,
                                                                     make_queue: Any, elsewhere: bool) -> None:
    # A receive cancelled in flight is undone by RELEASE_CALL: its messages are ready again, and a
    # receiver that found nothing meanwhile must look (this queue object: its own wake-up; another
    # process: RELEASE_CALL publishes).
    here = make_queue(safety_poll_s=300)
    there = make_queue(redis=make_client(), safety_poll_s=300) if elsewhere else here
    async with here, there:
        receiver = await _parked(there)
        await client.rpush(here.name, json.dumps("a").encode())  # ready, unannounced: nobody looks
        consumer = here._life.reliable()
        call_id = os.urandom(16)
        reply = await consumer._scripts.receive.resend(10, 30_000, 0, call_id, durable=True)
        assert reply[7]  # the RECEIVE took it
        await consumer._release(call_id)  # as a receive cancelled mid-call is undone
        got = await receiver
        assert got is not None
        assert (got.value, got.delivery_count) == ("a", 1)
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


# -- at batch speed: prefetched receives, acks written behind ----------------------------------------


async def test_messages_and_acks_one_at_a_time_share_round_trips(client: Redis, make_queue: Any) -> None:
    n = 3 * MAX_PREFETCH
    q = make_queue(codec="json")
    async with open_with_ready(client, q, n):
        got = []
        async for msg in q.messages(visibility_timeout=timedelta(seconds=30)):
            got.append(msg.value)
            assert msg.delivery_count == 1
            assert await msg.ack()  # written behind: known to apply, not waited for
            if len(got) == n:
                break
        assert got == list(range(n))  # list order, one by one, none twice
        # One round trip per message would be n receives and n settles; the prefetch grows to 100
        # per receive (it may halve if the machine stalls a receive past the hold).
        assert q.stats.receives <= n // 4
        assert q.stats.settle_calls <= n // 4
        await until(lambda: _in_flight_is(client, q, 0), timeout_s=5)
    assert q.stats.unconfirmed_settles == 0
    assert await client.llen(q.keys.destination) == 0


async def _in_flight_is(client: Redis, q: Any, n: int) -> bool:
    return int(await client.zcard(q.keys.in_flight)) == n


async def test_close_sends_the_acks_written_behind(client: Redis, make_queue: Any) -> None:
    n = 150
    q = make_queue(codec="json", safety_poll_s=300)
    async with open_with_ready(client, q, n):
        msgs = await q.receive_many(n, visibility_timeout=30, timeout=5)
        assert len(msgs) == n
        for msg in msgs:
            assert await msg.ack()  # no durable writes: written behind by default
        # No await since the acks: nothing has been sent yet; closing must send them.
        assert q.stats.settle_calls == 0
    assert await client.zcard(q.keys.in_flight) == 0
    assert q.stats.unconfirmed_settles == 0


async def test_messages_given_back_go_out_before_what_follows_them(client: Redis, make_queue: Any) -> None:
    # Prefetched messages nobody came for go back to the head of the list by a SETTLE written behind;
    # a RECEIVE sent at once after must not pop what follows them first (it waits for that SETTLE).
    q = make_queue(codec="json", safety_poll_s=300)
    async with open_with_ready(client, q, 30):
        first = await q.receive_many(10, visibility_timeout=30, timeout=5)
        assert [m.value for m in first] == list(range(10))
        q._life.reliable()._release_unclaimed(first)  # as when their hold ends: given back, uncounted
        again = await q.receive_many(30, visibility_timeout=30, timeout=5)
        assert [m.value for m in again][:10] == list(range(10))
        assert all(m.delivery_count == 1 for m in again)


async def test_acks_written_behind_ride_on_the_read_ahead(client: Redis, make_queue: Any) -> None:
    n = 2000
    q = make_queue(codec="json", safety_poll_s=300)
    async with open_with_ready(client, q, n):
        got: list[int] = []
        while len(got) < n:
            msgs = await q.receive_many(100, visibility_timeout=30, timeout=5)
            got += [m.value for m in msgs]
            for msg in msgs:
                assert await msg.ack()
        assert got == list(range(n))
        # The first 7 receives grow the prefetch to its largest size, each with a SETTLE after it;
        # then each receive is read ahead, and carries the acks written before it went out. The last
        # batch's acks go with a SETTLE, as may a few when the caller came after a read-ahead landed.
        assert q.stats.settle_calls <= 10
        await until(lambda: _in_flight_is(client, q, 0), timeout_s=5)
    assert q.stats.unconfirmed_settles == 0


async def _receive_and_ack_written_behind(q: DelayedQueue[Any], n: int) -> list[Message[Any]]:
    """``n`` messages received, each acked (written behind): no await after the acks."""
    msgs = await q.receive_many(n, visibility_timeout=30, timeout=5)
    assert len(msgs) == n
    for msg in msgs:
        assert await msg.ack()  # written behind; no await until the next receive, which carries them
    return msgs


@contextlib.asynccontextmanager
async def _acked_behind(own_server: Any, make_proxy: Any, make_client: Any, make_queue: Any,
                        **options: Any) -> AsyncIterator[tuple[DelayedQueue[int], Any, Redis]]:
    """An open queue behind a fault proxy (and the proxy, and a client past it) whose first 20 of 40
    messages were received and acked, written behind: the acks wait for the next call."""
    server = own_server()
    proxy = make_proxy(server)
    admin = make_client(server)
    q: DelayedQueue[int] = make_queue(redis=make_client(proxy), codec="json", safety_poll_s=300, **options)
    async with q:
        await q.offer_many([(i, 0) for i in range(40)])
        await until(lambda: llen_is(admin, q, 40))
        await _receive_and_ack_written_behind(q, 20)
        yield q, proxy, admin


async def test_acks_a_receive_carried_are_applied_once_when_its_reply_is_lost(
        own_server: Any, make_proxy: Any, make_client: Any, make_queue: Any,
        caplog: pytest.LogCaptureFixture) -> None:
    async with _acked_behind(own_server, make_proxy, make_client, make_queue) as (q, proxy, admin):
        proxy.kill_after_send(QueueScripts.receive.sha.encode())  # it ran; its reply is lost; resent
        with caplog.at_level(logging.WARNING, logger="aiodelayq"):
            # The RECEIVE a read-ahead sends, carrying the acks.
            reply = await q._life.reliable()._call(20, 30_000, carry=True)
        assert proxy.killed == 1
        assert reply[6] == -1  # the resend: the first run applied them
        assert q.stats.settle_calls == 0  # the acks went with the receive
        assert len(reply[7]) == 20
        assert await admin.zcard(q.keys.in_flight) == 20  # the second batch only: the first's acks landed
    assert q.stats.unconfirmed_settles == 0
    assert not [r for r in caplog.records if "visibility timeout" in r.getMessage()]


async def test_acks_a_failed_receive_carried_go_again_with_a_settle(
        own_server: Any, make_proxy: Any, make_client: Any, make_queue: Any,
        caplog: pytest.LogCaptureFixture) -> None:
    async with _acked_behind(own_server, make_proxy, make_client, make_queue, call_timeout_s=0.5) as (q, proxy,
                                                                                                   admin):
        # The receive carrying the acks runs, and its reply and every resend's are lost: it fails.
        proxy.kill_after_send(QueueScripts.receive.sha.encode(), times=1000)
        with caplog.at_level(logging.WARNING, logger="aiodelayq"):
            with pytest.raises(BackendError) as failed:
                await q._life.reliable()._call(20, 30_000, carry=True)  # a read-ahead's RECEIVE
            assert failed.value.maybe_applied
            proxy.disarm()
            # The acks go again with a SETTLE, which finds them applied; the receive is undone.
            await until(lambda: _given_back(admin, q, 20))
            await until(lambda: q.stats.settle_calls >= 1)
        assert await admin.lrange(q.keys.destination, 0, -1) == [str(i).encode() for i in range(20, 40)]
        again = await q.receive_many(20, visibility_timeout=30, timeout=5)
        assert [(m.value, m.delivery_count) for m in again] == [(i, 1) for i in range(20, 40)]
    assert q.stats.unconfirmed_settles == 0
    assert not [r for r in caplog.records if "visibility timeout" in r.getMessage()]


@pytest.mark.parametrize("how", ["stop", "close"])
async def test_what_a_read_ahead_received_goes_back_in_order_when_the_caller_stops(
        client: Redis, make_queue: Any, how: str) -> None:
    n = 1000
    q = make_queue(codec="json", safety_poll_s=300)
    async with open_with_ready(client, q, n):
        got: list[int] = []
        # The prefetch reaches its largest size after 7 full receives; from then on a receive whose
        # messages all go to its caller sends the next before it parses them. Stop with one out.
        while q._life.reliable()._ahead is None:
            assert len(got) < n - 100
            got += [m.value for m in await _receive_and_ack_written_behind(q, 100)]
        batches = len(got) // 100
        if how == "stop":
            await until(lambda: _in_flight_is(client, q, 0), timeout_s=5)  # released after the hold
    if how == "close":
        assert await client.zcard(q.keys.in_flight) == 0
    assert got == list(range(batches * 100))
    assert q.stats.released >= 100  # a read-ahead's messages, which nobody came for
    rest = [int(x) for x in await client.lrange(q.keys.destination, 0, -1)]
    assert rest == list(range(batches * 100, n))
    assert q.stats.unconfirmed_settles == 0


async def test_settles_of_every_kind_in_one_call_each_get_their_answer(client: Redis, make_queue: Any) -> None:
    q = make_queue(codec="json", safety_poll_s=300)
    async with open_with_ready(client, q, 6):
        m = await q.receive_many(6, visibility_timeout=30, timeout=5)
        calls = q.stats.settle_calls
        results = await asyncio.gather(m[0].ack(confirm=True), m[1].nack(delay=60), m[2].nack(dead_letter=True),
                                       m[3].release(), m[4].ack(), m[5].ack())
        assert results == [True] * 6
        assert q.stats.settle_calls - calls <= 2  # the first alone, then the rest together
        await until(lambda: _in_flight_is(client, q, 1), timeout_s=5)
        [(element, due)] = await client.zrange(q.keys.in_flight, 0, -1, withscores=True)
        assert element.endswith(b"1")
        assert due > await server_ms(client) + 50_000
        [letter] = await q.dead_letters()
        assert (letter.value, letter.reason) == (2, "nacked")
        assert await client.lrange(q.keys.destination, 0, -1) == [b"3"]  # released: visible, count not raised
        again = await q.receive(visibility_timeout=30, timeout=5)
        assert again is not None
        assert (again.value, again.delivery_count) == (3, 1)
    assert q.stats.unconfirmed_settles == 0


async def test_prefetched_messages_nobody_receives_are_released_within_a_round_trip(
        client: Redis, make_queue: Any) -> None:
    n = 200
    q = make_queue(codec="json")
    async with open_with_ready(client, q, n):
        received = [await q.receive(visibility_timeout=30, timeout=5) for _ in range(20)]
        values = [m.value for m in received if m is not None]
        assert values == list(range(20))
        # Receives of 1, 2, 4, 8, 16 messages served 20 receivers: about 11 were prefetched for
        # nobody. Within a round trip (at most 50 ms) they are released: back at the head of the
        # list in order, out of flight, their delivery not counted.
        await until(lambda: llen_is(client, q, n - 20), timeout_s=1)
        assert await client.zcard(q.keys.in_flight) == 20
        assert q.stats.released >= 1
        assert not q._life.reliable()._buffer
        rest = await client.lrange(q.keys.destination, 0, -1)
        assert [int(x) for x in rest] == list(range(20, n))
        again = await q.receive(visibility_timeout=30, timeout=5)
        assert again is not None
        assert (again.value, again.delivery_count) == (20, 1)


async def test_close_with_prefetched_messages_loses_nothing(client: Redis, make_queue: Any) -> None:
    n = 300
    q = make_queue(codec="json", safety_poll_s=300)
    async with open_with_ready(client, q, n):
        received = [await q.receive(visibility_timeout=30, timeout=5) for _ in range(40)]
    # Closed at once, messages perhaps still prefetched: all released, the received ones in flight.
    rest = [int(x) for x in await client.lrange(q.keys.destination, 0, -1)]
    assert sorted([m.value for m in received if m is not None] + rest) == list(range(n))
    assert await client.zcard(q.keys.in_flight) == 40


async def test_an_ack_near_its_deadline_waits_for_the_answer(client: Redis, make_queue: Any) -> None:
    q = make_queue(codec="json", call_timeout_s=5.0)
    async with open_with_ready(client, q, 1):
        msg = await q.receive(visibility_timeout=3, timeout=5)  # less than call_timeout_s left
        assert msg is not None
        assert await msg.ack()
        assert await client.zcard(q.keys.in_flight) == 0  # confirmed before ack() returned
        assert not await msg.ack()


async def test_an_ack_that_cannot_be_written_is_reported_and_the_message_comes_back(
        own_server: Any, make_proxy: Any, make_client: Any, make_queue: Any,
        caplog: pytest.LogCaptureFixture) -> None:
    server = own_server()
    proxy = make_proxy(server)
    client, direct = make_client(proxy), make_client(server)
    q: DelayedQueue[str] = make_queue("wb", redis=client, codec="str", call_timeout_s=0.5)
    other: DelayedQueue[str] = make_queue("wb", redis=direct, codec="str")
    async with q, other:
        await q.offer("job", 0)
        msg = await q.receive(visibility_timeout=1.5, timeout=5)
        assert msg is not None
        proxy.pause()  # Redis unreachable for longer than call_timeout_s
        with caplog.at_level(logging.WARNING, logger="aiodelayq"):
            assert await msg.ack()  # written behind: returns at once
            await until(lambda: q.stats.unconfirmed_settles == 1, timeout_s=5)
        assert any("not confirmed" in r.getMessage() for r in caplog.records)
        proxy.resume()
        again = await other.receive(visibility_timeout=30, timeout=5)  # after msg's deadline
        assert again is not None
        assert (again.value, again.id, again.delivery_count) == ("job", msg.id, 2)
        assert await again.ack(confirm=True)


async def test_concurrent_confirmed_acks_share_a_call(client: Redis, make_queue: Any) -> None:
    n = 50
    q = make_queue(codec="json")
    async with open_with_ready(client, q, n):
        msgs = await q.receive_many(n, visibility_timeout=30, timeout=5)
        calls = q.stats.settle_calls
        assert all(await asyncio.gather(*(m.ack(confirm=True) for m in msgs)))
        assert q.stats.settle_calls - calls <= 2  # the first call alone, then the rest together
        assert await client.zcard(q.keys.in_flight) == 0


# -- leases: extend() and async with msg.lease() ---------------------------------------------------


@contextlib.asynccontextmanager
async def received(make_queue: Any, payload: str, vt_s: float) -> AsyncIterator[tuple[Any, Message[Any]]]:
    """An open queue and the first delivery of ``payload``, held for ``vt_s`` seconds."""
    q = make_queue(codec="json")
    await q.offer(payload, 0)
    async with q:
        msg = await q.receive(visibility_timeout=vt_s, timeout=5)
        assert msg is not None
        yield q, msg


async def test_extend_moves_the_deadline_and_fails_once_not_held(client: Redis, make_queue: Any) -> None:
    async with received(make_queue, "job", 1.0) as (q, msg):
        before = int(await server_ms(client))
        assert await msg.extend(30)
        assert before + 30_000 <= msg.deadline_ms <= await server_ms(client) + 30_000
        assert await client.zscore(q.keys.in_flight, msg._element) == msg.deadline_ms
        assert msg.remaining_s > 29
        assert await q.receive(visibility_timeout=30, timeout=1.3) is None  # not redelivered at 1.0 s
        assert await msg.ack(confirm=True)
        assert not await msg.extend(30)  # settled: no longer held


async def test_a_lease_keeps_a_long_job_and_stops_at_exit(client: Redis, make_queue: Any) -> None:
    # A timeout of 0.9 s: a busy machine's loop may lag a few hundred ms without losing the lease.
    async with received(make_queue, "long", 0.9) as (q, msg):
        async with msg.lease() as lease:  # extends every 0.3 s by 0.9 s
            await until(lambda: lease.extensions >= 7, timeout_s=15)  # held 2.1 s: over two timeouts
            assert await q.receive(visibility_timeout=30, timeout=0.01) is None
        assert not lease.lost
        assert lease._task is not None
        assert lease._task.done()  # stopped at exit
        assert await msg.ack(confirm=True)


async def test_a_cancelled_block_stops_its_lease(make_queue: Any) -> None:
    async with received(make_queue, "job", 0.3) as (q, msg):
        lease = msg.lease()

        async def job() -> None:
            async with lease:
                await asyncio.sleep(30)

        task = asyncio.ensure_future(job())
        await until(lambda: lease.extensions >= 1)  # the lease runs
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert lease._task is not None
        assert lease._task.done()
        again = await q.receive(visibility_timeout=30, timeout=5)  # no longer extended: back after 0.3 s
        assert again is not None
        assert again.delivery_count == 2


async def test_a_lease_that_loses_its_message_says_so(make_queue: Any) -> None:
    async with received(make_queue, "job", 0.3) as (_, msg):
        async with msg.lease(every=0.2) as lease:
            assert await msg.ack(confirm=True)  # settled meanwhile (e.g. by another path)
            await until(lambda: lease.lost)  # its next extension finds the message gone
        assert lease.lost
        with pytest.raises(InvalidDelayError):
            msg.lease(every=1)  # not shorter than the timeout


HOLDER = textwrap.dedent("""
    import asyncio, sys
    from redis.asyncio import Redis
    from aiodelayq import DelayedQueue

    async def main(url, name):
        async with DelayedQueue(Redis.from_url(url), name, codec="json") as q:
            msg = await q.receive(visibility_timeout=2.0, timeout=10)
            async with msg.lease():  # extends every ~0.67 s
                print("holding", flush=True)
                await asyncio.sleep(60)  # the test kills this process

    asyncio.run(main(sys.argv[1], sys.argv[2]))
""")


@pytest.mark.waits
async def test_a_killed_holder_s_lease_ends_and_the_message_comes_back(redis_server: Any, make_queue: Any,
                                                                       qname: str, spawn_consumer: Any) -> None:
    q = make_queue(codec="json")
    await q.offer("job", 0)
    child = spawn_consumer(HOLDER, args=[redis_server.url, qname])
    assert (await first_line(child)).strip() == "holding"
    async with q:
        assert await q.receive(visibility_timeout=30, timeout=2.5) is None  # the lease holds it past 2 s
        child.send_signal(signal.SIGKILL)
        await child.await_exit(10)
        again = await q.receive(visibility_timeout=30, timeout=10)  # the lease ended with the process
        assert again is not None
        assert (again.value, again.delivery_count) == ("job", 2)


# -- resends after a lost reply -----------------------------------------------------------------------


async def test_a_resent_receive_and_ack_are_not_counted_twice(own_server: Any, make_proxy: Any, make_client: Any,
                                                              make_queue: Any) -> None:
    proxy = make_proxy(own_server())
    client = make_client(proxy)
    q: DelayedQueue[str] = make_queue("lost-r", redis=client, codec="str", max_deliveries=1)
    async with q:
        for expected, x in enumerate("abc"):
            await q.offer(x, 0)  # one at a time: each receive makes its own call (no prefetched message)
            proxy.kill_after_send(QueueScripts.receive.sha.encode())
            msg = await q.receive(30, timeout=5)
            assert msg is not None
            assert (msg.value, msg.delivery_count) == (x, 1)
            proxy.kill_after_send(QueueScripts.settle.sha.encode())
            assert await msg.ack(confirm=True) is True  # applied, reply lost, resent: still the truth
            assert proxy.killed == 2 * (expected + 1)
        assert await q.receive(0.1, timeout=0.3) is None
        assert await q.dead_letters() == []
        assert await client.zcard(q.keys.in_flight) == 0


async def test_a_resent_receive_returns_its_redeliveries_and_first_deliveries_and_its_undo_releases_them(
        client: Redis, make_queue: Any) -> None:
    # The call's record holds its redeliveries' ids; its first deliveries are known by the call id's
    # prefix. A resend returns all of them, another call's message with the same deadline none.
    q: DelayedQueue[str] = make_queue(codec="str")
    async with q:
        await q.offer("old", 0)
        first = await q.receive(visibility_timeout=0.1, timeout=5)
        assert first is not None
        await until(lambda: server_past(client, first.deadline_ms))  # due again: a redelivery
        await client.rpush(q.name, b"a", b"b")
        scripts = q._life.reliable()._scripts
        call_id = os.urandom(16)
        reply = await scripts.receive.resend(10, 60_000, 0, call_id, durable=True)
        made = sorted(reply[7])
        assert len(made) == 3
        await client.rpush(q.name, b"c")
        other = await scripts.receive.resend(10, 60_000, 0, os.urandom(16), durable=True)
        assert len(other[7]) == 1
        if int(other[0]) != int(reply[0]):  # another deadline: make it the same, as two calls in one ms
            [theirs] = other[7]
            await client.zadd(q.keys.in_flight, {theirs: int(reply[0]) + 60_000})
        again = await scripts.receive.resend(10, 60_000, 0, call_id, durable=True)
        assert sorted(again[7]) == made
        assert await scripts.release_call.resend(call_id) == 3
        assert await client.lrange(q.name, 0, -1) == [b"a", b"b"]  # first deliveries: back in order
        assert await client.zcard(q.keys.in_flight) == 2  # the redelivery (count lowered) and "c"
        back = await q.receive_many(3, visibility_timeout=30, timeout=5)
        assert sorted((m.value, m.delivery_count) for m in back) == [("a", 1), ("b", 1), ("old", 2)]


async def test_a_resent_receive_keeps_the_true_deadline(own_server: Any, make_proxy: Any, make_client: Any,
                                                        make_queue: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(backoff_module, "RETRY_BACKOFF", ConstantBackoff(0.6))
    server = own_server()
    proxy = make_proxy(server)
    client, admin, direct = make_client(proxy), make_client(server), make_client(server)
    q: DelayedQueue[str] = make_queue("r2", redis=client, codec="str")
    other: DelayedQueue[str] = make_queue("r2", redis=direct, codec="str")
    async with q, other:
        await q.offer("warm", 0)
        warm = await q.receive(1.0, timeout=5)
        assert warm is not None
        assert await warm.ack(confirm=True)  # RECEIVE and SETTLE loaded
        await q.offer("m", 0)
        await until(lambda: llen_is(admin, q, 1))  # ready: the receive below gets it
        proxy.kill_after_send(QueueScripts.receive.sha.encode())
        # Resent 0.6 s after the loss, well inside the 2 s timeout the lost call started.
        msg = await q.receive(visibility_timeout=2.0, timeout=5)
        assert msg is not None
        [(_, score)] = await admin.zrange(q.keys.in_flight, 0, -1, withscores=True)
        assert msg.deadline_ms == int(score)
        again = await other.receive(visibility_timeout=30, timeout=5)  # after the true deadline
        assert again is not None
        assert again.delivery_count == 2
        monkeypatch.setattr(backoff_module, "RETRY_BACKOFF", ConstantBackoff(0.01))
        proxy.kill_after_send(QueueScripts.settle.sha.encode())
        assert await msg.ack() is False  # superseded (and too late to write behind): never claims a settle
        assert await admin.zcard(q.keys.in_flight) == 1


async def test_a_receive_that_fails_gives_its_messages_back_in_order(own_server: Any, make_proxy: Any,
                                                                     make_client: Any, make_queue: Any) -> None:
    # Found by the model-based test (tests/test_model.py), there with a stall past the call's bound:
    # a receive that fails after its RECEIVE ran is undone (RELEASE_CALL), which puts the messages
    # back at the head of the list, where they were, in their order, their delivery not counted.
    server = own_server()
    proxy = make_proxy(server)
    admin = make_client(server)
    q: DelayedQueue[str] = make_queue("undo", redis=make_client(proxy), codec="str", call_timeout_s=0.5)
    async with q:
        await q.offer("warm", 0)
        warm = await q.receive(visibility_timeout=30, timeout=5)
        assert warm is not None
        assert await warm.ack(confirm=True)  # RECEIVE loaded: the one below runs
        await q.offer_many([(x, 0) for x in "abcd"])
        await until(lambda: llen_is(admin, q, 4))
        # It runs; its reply, and every resend's, lost.
        proxy.kill_after_send(QueueScripts.receive.sha.encode(), times=1000)
        with pytest.raises(BackendError) as failed:
            await q.receive_many(3, visibility_timeout=30, timeout=0.01)
        assert failed.value.maybe_applied
        proxy.disarm()
        await until(lambda: _given_back(admin, q, 4))  # undone
        assert await admin.lrange(q.keys.destination, 0, -1) == [b"a", b"b", b"c", b"d"]
        msgs = await q.receive_many(4, visibility_timeout=30, timeout=5)
        assert [(m.value, m.delivery_count) for m in msgs] == [("a", 1), ("b", 1), ("c", 1), ("d", 1)]


async def _given_back(admin: Redis, q: DelayedQueue[Any], n: int) -> bool:
    return await admin.zcard(q.keys.in_flight) == 0 and int(await admin.llen(q.keys.destination)) == n


@pytest.mark.parametrize("how", ["ack", "nack-dead"])
async def test_a_settle_after_the_deadline_whose_reply_is_lost_says_it_applied(
        own_server: Any, make_proxy: Any, make_client: Any, make_queue: Any, how: str) -> None:
    # Found by the model-based test (tests/test_model.py): a message past its deadline and not yet
    # redelivered is still this delivery's to settle (True); a lost reply must not turn that into False.
    server = own_server()
    proxy = make_proxy(server)
    admin = make_client(server)
    q: DelayedQueue[str] = make_queue("late-ack", redis=make_client(proxy), codec="str")
    async with q:
        await q.offer("warm", 0)
        warm = await q.receive(visibility_timeout=30, timeout=5)
        assert warm is not None
        assert await warm.ack(confirm=True)  # SETTLE loaded: the lost reply below is of a SETTLE that ran
        await q.offer("job", 0)
        msg = await q.receive(visibility_timeout=0.2, timeout=5)
        assert msg is not None
        await until(lambda: server_past(admin, msg.deadline_ms))  # no receive since: not redelivered
        proxy.kill_after_send(QueueScripts.settle.sha.encode())  # applied, reply lost: resent
        settled = await (msg.ack(confirm=True) if how == "ack" else msg.nack(dead_letter=True))
        assert await admin.zcard(q.keys.in_flight) == 0  # the first attempt applied it
        assert settled is True


# -- several consumer processes acking a steady stream of due items ----------------------------------
# 2,000 items/s fall due for 4 s (offered 0.5 s ahead, due times spread evenly) while three separate
# processes each run ``async for msg in q.messages(30): await msg.ack()`` on the queue: every item is
# received, none twice, none before its due time (the server clock at receipt against the due time
# ``offer_many`` returned). How late they come is measured by the benchmarks (scenario
# ``reliable_lateness``); a failure's report gives it too.

RATE = 2000.0  # items falling due per second
SECONDS = 4.0  # length of the due window
CONSUMERS = 3
START_OFFSET_S = 0.5  # the window starts this long after the producer starts
LEAD_S = 0.5  # each item is offered this long before it is due
TICK_S = 0.05  # the producer offers every TICK_S
# Receipt times are this machine's clock, moved to the server's by an offset read from the fastest of
# 25 TIME round trips: this much covers its error.
CLOCK_SLACK_MS = 5.0

ACKING_CONSUMER = r"""
import asyncio, json, os, sys, time
from redis.asyncio import Redis
from aiodelayq import DelayedQueue

url, name, stop_key = sys.argv[1], sys.argv[2], sys.argv[3]


async def main():
    client = Redis.from_url(url)
    ids, times, redelivered, ack_false = [], [], 0, 0
    try:
        q = DelayedQueue(client, name)
        async with q:

            async def close_when_told():
                loop = asyncio.get_running_loop()
                deadline = loop.time() + 90  # never outlive the test
                while not await client.exists(stop_key) and loop.time() < deadline:
                    await asyncio.sleep(0.02)
                await q.aclose()  # ends the iteration below

            closer = asyncio.create_task(close_when_told())
            print("ready", flush=True)
            async for msg in q.messages(30):
                times.append(round(time.time() * 1000.0, 3))
                ids.append(msg.value)
                if msg.delivery_count > 1:
                    redelivered += 1
                if not await msg.ack():
                    ack_false += 1
            await closer
            stats = q.stats
    finally:
        await client.aclose()
    print("result " + json.dumps({"ids": ids, "times": times, "redelivered": redelivered, "ack_false": ack_false,
                                  "transfers": stats.transfers, "cpu_s": sum(os.times()[:2])}), flush=True)


asyncio.run(main())
"""


async def _clock_offset_ms(client: Redis) -> float:
    """Server epoch ms minus ``time.time() * 1000``, from the ``TIME`` call with the smallest round trip."""
    at_s, now_ms = await server_clock_at(client, time.time, samples=25)
    return now_ms - at_s * 1000.0


async def _produce(q: DelayedQueue[int], offset_ms: float, total: int) -> dict[int, float]:
    """Item i due at start + START_OFFSET_S + i / RATE, offered LEAD_S ahead; returns id -> due ms."""
    loop = asyncio.get_running_loop()
    due: dict[int, float] = {}
    start_ms = time.time() * 1000.0 + offset_ms
    tick = loop.time()
    next_id = 0
    while next_id < total:
        now = time.time() * 1000.0 + offset_ms
        batch: list[tuple[int, float]] = []
        while next_id < total and len(batch) < 1000:
            target = start_ms + START_OFFSET_S * 1000.0 + next_id * 1000.0 / RATE
            if target > now + LEAD_S * 1000.0:
                break
            batch.append((next_id, max(0.0, (target - now) / 1000.0)))
            next_id += 1
        if batch:
            for (item, _), due_ms in zip(batch, await q.offer_many(batch), strict=True):
                due[item] = float(due_ms)
            if len(batch) == 1000:
                continue
        tick += TICK_S
        await asyncio.sleep(max(0.0, tick - loop.time()))
    return due


def _percentile(sorted_values: list[float], p: float) -> float:
    return sorted_values[min(len(sorted_values), max(1, math.ceil(p / 100.0 * len(sorted_values)))) - 1]


@pytest.mark.slow
async def test_three_consumer_processes_receive_and_ack_every_due_item_once_and_none_early(
        redis_server: Any, client: Redis, qname: str, make_queue: Any, drop_keys: Any, spawn_consumer: Any) -> None:
    total = round(RATE * SECONDS)
    stop_key = f"{qname}:stop"
    drop_keys(stop_key)
    q: DelayedQueue[int] = make_queue()
    keys = q.keys
    children = [spawn_consumer(ACKING_CONSUMER, args=[redis_server.url, qname, stop_key]) for _ in range(CONSUMERS)]
    for child in children:
        await child.await_line("ready", timeout_s=60)
    offset_ms = await _clock_offset_ms(client)
    load_before = os.getloadavg()
    due = await _produce(q, offset_ms, total)

    async def all_acked() -> bool:
        return not (await client.zcard(keys.timeout_set) or await client.llen(keys.destination)
                    or await client.zcard(keys.in_flight))

    await until(all_acked, timeout_s=30, interval_s=0.05)  # does not hang: the last is due after ~4.5 s
    load_after = os.getloadavg()
    await client.set(stop_key, 1)
    for child in children:
        assert await child.await_exit(30) == 0, child.stderr
    results = [json.loads(line.split(" ", 1)[1]) for child in children for line in child.lines
               if line.startswith("result ")]
    assert len(results) == CONSUMERS, [child.stderr for child in children]

    first: dict[int, float] = {}
    receipts = 0
    for res in results:
        receipts += len(res["ids"])
        for item, t in zip(res["ids"], res["times"], strict=True):
            first[item] = min(t, first.get(item, math.inf))
    lateness = sorted(first[i] + offset_ms - due[i] for i in first if i in due)
    window_start = min(due.values())
    per_second: dict[int, list[float]] = {}
    for i in first:
        if i in due:
            per_second.setdefault(int((due[i] - window_start) // 1000), []).append(first[i] + offset_ms - due[i])
    timeline = ", ".join(f"{_percentile(sorted(v), 50):.1f}/{max(v):.1f}" for _, v in sorted(per_second.items()))
    lost = sorted(i for i in due if i not in first)
    early = sorted(i for i in first if i in due and first[i] + offset_ms < due[i] - CLOCK_SLACK_MS)
    p50, p99, worst = _percentile(lateness, 50), _percentile(lateness, 99), lateness[-1]
    report = (f"lateness p50 {p50:.2f} ms, p99 {p99:.2f} ms, max {worst:.2f} ms; received per process "
              f"{[len(r['ids']) for r in results]}, transfers {[r['transfers'] for r in results]}, consumer CPU s "
              f"{[round(r['cpu_s'], 1) for r in results]}; redelivered {sum(r['redelivered'] for r in results)}, "
              f"failed acks {sum(r['ack_false'] for r in results)}; per due second p50/max ms {timeline}; "
              f"loadavg {load_before} -> {load_after}")
    assert len(due) == total, report
    assert not lost, f"{len(lost)} lost (first {lost[:10]}); {report}"
    assert receipts == len(first), f"{receipts - len(first)} duplicates; {report}"
    assert not set(first) - set(due), report
    assert not early, f"{len(early)} received before they were due (first {early[:10]}); {report}"
