"""Regression tests for lifecycle and failure paths: timeouts, retries, stalls, races."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from typing import Any

import pytest
from redis.asyncio import Redis

from aiodelayq import DelayedQueue, QueueClosedError
from aiodelayq._consumer import TakePump
from aiodelayq._registry import runtime_for
from aiodelayq._scripts import scripts_for


async def test_blpop_read_does_not_use_the_socket_timeout(redis_server: Any, qname: str,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    # BLPOP blocks 0.6 s on the server; a socket timeout of 0.2 s must not cut it (a cut read
    # drops the connection, and an item handed to it in that instant would be lost).
    client = Redis.from_url(redis_server.url, socket_timeout=0.2)
    pump = TakePump(client, qname, block_s=0.6)
    try:
        with caplog.at_level(logging.WARNING, logger="aiodelayq"):
            waiter = asyncio.create_task(pump.get(None))
            await asyncio.sleep(1.0)  # longer than one BLPOP: it must have been re-issued cleanly
            await client.rpush(qname, b"x")
            assert await asyncio.wait_for(waiter, 5) == [b"x"]
        assert "failed" not in caplog.text
    finally:
        pump.fail_waiters(QueueClosedError("test over"))
        await pump.aclose(2)
        await client.delete(qname)
        await client.aclose()


async def test_an_item_popped_before_a_failing_lpop_is_not_dropped(own_server: Any) -> None:
    server = own_server()
    admin = Redis.from_url(server.url)
    await admin.execute_command("ACL", "SETUSER", "nolpop", "on", "nopass", "~*", "&*", "+@all", "-lpop")
    client = Redis.from_url(server.url, username="nolpop", password="")
    pump = TakePump(client, "q", block_s=1.0)
    try:
        takers = [asyncio.create_task(pump.get(None)) for _ in range(2)]
        await asyncio.sleep(0.2)  # both wait: the pump will BLPOP one and LPOP one more (denied)
        await admin.rpush("q", b"a", b"b")
        got = await asyncio.wait_for(asyncio.gather(*takers), 10)
        assert sorted(got) == [[b"a"], [b"b"]]
    finally:
        pump.fail_waiters(QueueClosedError("test over"))
        await pump.aclose(2)
        await client.aclose()
        await admin.aclose()


async def test_a_resent_offer_script_writes_nothing_twice(client: Redis, make_queue: Any) -> None:
    q = make_queue()
    k = q.keys
    args = ["1", 60_000, os.urandom(8), b'"job"']
    keys = [k.destination, k.timeout_set, k.delay_list, k.channel]
    first = await scripts_for(client).offer(keys=keys, args=args)
    again = await scripts_for(client).offer(keys=keys, args=args)  # as a retry after a lost reply would
    assert first == again
    assert await client.zcard(k.timeout_set) == 1
    assert await client.llen(k.delay_list) == 1


async def test_absurd_published_due_times_do_not_kill_the_subscriber(client: Redis, make_queue: Any) -> None:
    q = make_queue(safety_poll_s=300)
    async with q:
        runtime = runtime_for(client)
        assert runtime is not None
        for junk in ("9" * 400, "-" + "9" * 30, "1e308", "", "\x00\xff"):
            await client.publish(q.keys.channel, junk)
        await q.offer("on-time", 0.2)
        assert await asyncio.wait_for(q.take(), 3) == "on-time"
        assert runtime.subscriber._task is not None
        assert not runtime.subscriber._task.done()


async def test_takes_after_close_fail_instead_of_hanging(client: Redis, make_queue: Any) -> None:
    q = make_queue()
    await client.rpush(q.keys.destination, b"{undecodable")
    async with q:
        pump = q._pump
    with pytest.raises(QueueClosedError):
        await asyncio.wait_for(pump.get(None), 2)
    with pytest.raises(QueueClosedError):
        await asyncio.wait_for(q.take(), 2)


async def test_aclose_is_bounded_when_the_server_stalls(own_server: Any) -> None:
    server = own_server()
    client = Redis.from_url(server.url, socket_timeout=None)
    q = DelayedQueue(client, "stall", close_timeout_s=1.0)
    await q.open()
    taker = asyncio.create_task(q.take())
    await asyncio.sleep(0.2)
    os.kill(server.pid, signal.SIGSTOP)
    try:
        loop = asyncio.get_running_loop()
        start = loop.time()
        await q.aclose()
        assert loop.time() - start < 2.0
        with pytest.raises(QueueClosedError):
            await taker
    finally:
        os.kill(server.pid, signal.SIGCONT)
        await client.aclose()


async def test_a_cancelled_aclose_still_closes_everything(client: Redis, make_queue: Any) -> None:
    q = make_queue()
    await q.open()
    closing = asyncio.create_task(q.aclose())
    await asyncio.sleep(0)
    closing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await closing
    await q.aclose()  # waits for the close that the cancelled caller started
    assert not q.is_open
    assert runtime_for(client) is None


async def test_open_racing_the_last_close_shares_one_runtime(client: Redis, make_queue: Any, qname: str) -> None:
    for _ in range(20):
        a, b = make_queue(), make_queue()
        await a.open()
        await asyncio.gather(a.aclose(), b.open())
        runtime = runtime_for(client)
        assert runtime is not None
        assert runtime.scheduler(qname) is not None
        c = make_queue()
        await c.open()
        assert runtime_for(client) is runtime
        await asyncio.gather(b.aclose(), c.aclose())
        assert runtime_for(client) is None


async def test_concurrent_opens_of_one_queue_object(make_queue: Any) -> None:
    q = make_queue()
    await asyncio.gather(q.open(), q.open(), q.open())
    assert q.is_open


async def test_many_idle_queues_share_one_pubsub_and_few_connections(redis_server: Any, qname: str) -> None:
    client = Redis.from_url(redis_server.url, max_connections=40)
    queues = [DelayedQueue(client, f"{qname}:{i}", safety_poll_s=0.5) for i in range(300)]
    try:
        await asyncio.gather(*(q.open() for q in queues))
        await asyncio.sleep(1.6)  # three safety-poll rounds of 300 queues
        assert sum(q.stats.transfer_errors for q in queues) == 0  # the pool (40) was never exhausted
        assert all(q.stats.transfers >= 3 for q in queues)
        runtime = runtime_for(client)
        assert runtime is not None
        assert runtime.subscriber.channels == 300
    finally:
        await asyncio.gather(*(q.aclose() for q in queues))
        await client.aclose()
