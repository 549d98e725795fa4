"""Scheduling: pending items move to the ready list at their due time, in due order and never early,
by a timer each client arms from what producers publish (one transfer task per queue and client), with
the transfer that open() runs for what fell due while nobody ran, the safety poll for a lost
publish, batches while more is due, and retries when a transfer fails."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from redis.asyncio import Redis

from aiodelayq import DelayedQueue
from aiodelayq._runtime.client_runtime import runtime_for
from tests.helpers import server_ms, server_past, until


async def test_items_come_out_in_due_order(make_queue: Any) -> None:
    q = make_queue()
    delays = [0.25, 0.05, 0.2, 0.0, 0.15, 0.1]
    await q.offer_many([(d, d) for d in delays])
    async with q:
        got = [await asyncio.wait_for(q.take(), 5) for _ in delays]
    assert got == sorted(delays)


async def test_an_offer_reaching_redis_after_its_due_time_is_moved_behind_what_moved_before(
        own_server: Any, make_client: Any, make_proxy: Any, make_queue: Any) -> None:
    # Due order holds among items pending together. Due times count from the call, so an offer held
    # on the way longer than its delay is due before it lands: the transfer moves it at once, behind
    # what it moved meanwhile (found by the model-based test, tests/test_model.py).
    server = own_server()
    proxy = make_proxy(server)
    q: DelayedQueue[str] = make_queue("order", redis=make_client(server), codec="str")
    held: DelayedQueue[str] = make_queue("order", redis=make_client(proxy), codec="str", call_timeout_s=5)
    await held.offer("warm", 600)  # the held producer has a clock estimate and the script loaded
    async with q:
        proxy.stall(0.5)
        early = asyncio.ensure_future(held.offer("due-first", 0.1))  # due at +0.1 s, lands at +0.5 s
        await asyncio.sleep(0.05)
        later = await q.offer("due-second", 0.2)  # due at +0.25 s, moved then
        assert await early < later
        assert [await asyncio.wait_for(q.take(), 5) for _ in range(2)] == ["due-second", "due-first"]


async def test_items_are_delivered_by_their_timers_and_never_early(client: Redis, make_queue: Any) -> None:
    # Timers are armed a little ahead of each due time; the server's clock decides what is due. Does
    # not hang: each is due within 0.3 s; the safety poll would take 300 s.
    q = make_queue(codec="json", safety_poll_s=300)
    async with q:
        dues = await q.offer_many([(i, 0.1 + 0.007 * i) for i in range(30)])
        for i in range(30):
            assert await asyncio.wait_for(q.take(), 5) == i
            assert await server_ms(client) >= dues[i]
        assert q.stats.moved == 30


async def test_startup_compensation_moves_items_that_fell_due_while_nobody_ran(client: Redis,
                                                                               make_queue: Any) -> None:
    producer = make_queue()
    dues = await producer.offer_many([(i, 0.05) for i in range(20)])
    await until(lambda: server_past(client, max(dues)))
    assert await producer.ready_size() == 0  # nothing moves without a transfer task
    async with make_queue() as consumer:
        assert await consumer.ready_size() == 20  # moved by the transfer that open() runs
        assert sorted([await consumer.take() for _ in range(20)]) == list(range(20))


async def test_earlier_item_from_another_client_re_arms_the_timer(make_client: Any, make_queue: Any) -> None:
    other = make_client()
    q = make_queue(safety_poll_s=300)
    async with q:
        await q.offer("late", 120)
        transfer_task = runtime_for(q._client).transfer_task(q.name)
        assert transfer_task is not None
        loop = asyncio.get_running_loop()
        await until(lambda: transfer_task.armed_at - loop.time() > 100)
        await make_queue(redis=other).offer("early", 0.2)
        assert await asyncio.wait_for(q.take(), 5) == "early"


async def test_a_later_wake_up_never_replaces_an_earlier_one(client: Redis, make_queue: Any) -> None:
    q = make_queue(safety_poll_s=300)
    async with q:
        due = await q.offer("soon", 2.0)  # the timer must not fire before the check, on a slow machine too
        transfer_task = runtime_for(client).transfer_task(q.name)
        assert transfer_task is not None
        armed = transfer_task.armed_at
        transfers = q.stats.transfers
        # A (skewed) Redisson producer announces a later head: the earlier timer must stay. What is
        # no number only wakes the transfer task: its transfer shows that both messages were read.
        await client.publish(q.keys.channel, str(due + 60_000))
        await client.publish(q.keys.channel, "not-a-number")
        await until(lambda: q.stats.transfers > transfers)
        assert transfer_task.armed_at <= armed
        assert await asyncio.wait_for(q.take(), 10) == "soon"


async def test_safety_poll_recovers_from_a_lost_publish(client: Redis, make_queue: Any) -> None:
    q = make_queue(safety_poll_s=0.3)
    async with q:
        await q.offer("far", 300)
        # Another producer writes an earlier element but its PUBLISH is lost.
        [element] = await client.zrange(q.keys.timeout_set, 0, 0)
        fake = element[:13] + b"\x01" * 8 + element[21:]  # same payload, another random id
        now = await server_ms(client)
        await client.zadd(q.keys.timeout_set, {fake: now})
        assert await asyncio.wait_for(q.take(), 5) == "far"


async def test_keeps_transferring_while_more_than_a_batch_is_due(client: Redis, make_queue: Any) -> None:
    q = make_queue(transfer_batch=10, safety_poll_s=300)
    await q.offer_many([(i, 0) for i in range(250)])
    async with q:
        # Waits for the replies (the stats), not for the zset: the last transfer empties it before
        # its reply is read.
        await until(lambda: q.stats.moved >= 250, timeout_s=5)
        assert await _empty(client, q)
        assert q.stats.transfers >= 25
        assert await q.ready_size() == 250


async def _empty(client: Redis, q: DelayedQueue[Any]) -> bool:
    return await client.zcard(q.keys.timeout_set) == 0


async def test_transfer_errors_are_retried_with_backoff_and_logged(own_server: Any, make_client: Any, make_queue: Any,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    client = make_client(own_server())
    q = make_queue("errors", redis=client, safety_poll_s=300)
    async with q:
        await q.offer("x", 0.3)
        await client.config_set("maxmemory-policy", "noeviction")
        await client.config_set("maxmemory", "1")  # the transfer's writes are refused
        with caplog.at_level(logging.WARNING, logger="aiodelayq"):
            await until(lambda: q.stats.transfer_errors >= 2, timeout_s=5)
        assert "transfer" in caplog.text
        await client.config_set("maxmemory", "0")
        assert await asyncio.wait_for(q.take(), 10) == "x"


@pytest.mark.parametrize("poll_s", [0.2, 300], ids=["seen-by-the-poll", "seen-by-failed-transfers"])
async def test_the_watchdog_warns_while_due_items_are_not_moved(own_server: Any, make_client: Any, make_queue: Any,
                                                              caplog: pytest.LogCaptureFixture, poll_s: float) -> None:
    # The safety poll reads the head; without it (a cluster's queues, or a long safety_poll_s) the
    # failing transfers estimate the lag from the head they last saw.
    client = make_client(own_server())
    q = make_queue("stalled", redis=client, safety_poll_s=poll_s, lag_warning_s=0.5)
    async with q:
        with caplog.at_level(logging.INFO, logger="aiodelayq"):
            await client.config_set("maxmemory-policy", "noeviction")
            await q.offer("x", 0.1)
            await client.config_set("maxmemory", "1")  # the transfer's writes are refused, reads work
            await until(lambda: "are not moved yet" in caplog.text, timeout_s=10)
            warning = next(r for r in caplog.records if "are not moved yet" in r.getMessage())
            assert warning.levelno == logging.WARNING
            assert "stalled" in warning.getMessage()
            assert "last transfer error" in warning.getMessage()
            assert (await q.counts()).lag_ms >= 500
            await client.config_set("maxmemory", "0")
            assert await asyncio.wait_for(q.take(), 10) == "x"
            await until(lambda: "is back to" in caplog.text, timeout_s=10)
        assert sum("are not moved yet" in r.getMessage() for r in caplog.records) == 1
        assert (await q.counts()).lag_ms == 0
