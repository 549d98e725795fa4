"""Regression tests for lifecycle and failure paths: timeouts, retries, stalls, races."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
from typing import Any

import pytest
from redis.asyncio import Redis

from aiodelayq import DelayedQueue, QueueClosedError
from aiodelayq._redis.connections import run_script
from aiodelayq._runtime.client_runtime import TRANSFER_SLOTS, runtime_for
from aiodelayq._scripts import OFFER
from tests.helpers import until


async def test_a_resent_offer_call_writes_nothing_twice_even_after_transfer(client: Redis, make_queue: Any) -> None:
    q = make_queue()
    k = q.keys
    keys = [k.destination, k.timeout_set, k.delay_list, k.channel, k.calls, k.call_replies, k.key_index]
    args = [os.urandom(16), "", "strict", "", 0, os.urandom(8), b'"job"']
    first = await run_script(client, OFFER, keys, args, timeout_s=5)
    async with q:  # the element falls due and is transferred
        assert await asyncio.wait_for(q.take(), 5) == "job"
        again = await run_script(client, OFFER, keys, args, timeout_s=5)  # as a resend after a lost reply
        assert again[:2] == [first[0], None]  # the same base; no clock reading (it is not a fresh run)
        assert await q.poll(0.3) is None
    assert await client.zcard(k.timeout_set) == 0
    assert await client.llen(k.delay_list) == 0


async def test_absurd_published_due_times_do_not_kill_the_subscriber(client: Redis, make_queue: Any) -> None:
    q = make_queue(safety_poll_s=300)
    async with q:
        runtime = runtime_for(client)
        assert runtime is not None
        for junk in ("9" * 400, "-" + "9" * 30, "1e308", "", "\x00\xff"):
            await client.publish(q.keys.channel, junk)
        await q.offer("on-time", 0.2)
        assert await asyncio.wait_for(q.take(), 3) == "on-time"
        assert runtime.subscriber._task.running
        assert runtime.subscriber._task.crashes == 0


async def test_takes_after_close_fail_instead_of_hanging(client: Redis, make_queue: Any) -> None:
    q = make_queue()
    await client.rpush(q.keys.destination, b"{undecodable")
    async with q:
        pump = q._life.pump()
    with pytest.raises(QueueClosedError):
        await asyncio.wait_for(pump.get(None), 2)
    with pytest.raises(QueueClosedError):
        await asyncio.wait_for(q.take(), 2)


async def test_aclose_is_bounded_when_the_server_stalls(own_server: Any, make_client: Any, make_queue: Any) -> None:
    server = own_server()
    q = make_queue("stall", redis=make_client(server, socket_timeout=None), close_timeout_s=1.0)
    await q.open()
    taker = asyncio.create_task(q.take())
    await asyncio.sleep(0.2)
    os.kill(server.pid, signal.SIGSTOP)
    try:
        loop = asyncio.get_running_loop()
        start = loop.time()
        await q.aclose()
        assert loop.time() - start < 3.0  # close_timeout_s (1 s) plus lag; SIGSTOP never ends by itself
        with pytest.raises(QueueClosedError):
            await taker
    finally:  # before the fixtures close the queue, the client and the server
        os.kill(server.pid, signal.SIGCONT)


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


async def test_many_idle_queues_share_one_pubsub_and_few_connections(qname: str, make_client: Any,
                                                                     make_queue: Any) -> None:
    client = make_client(max_connections=40)
    queues = [make_queue(f"{qname}:{i}", redis=client, safety_poll_s=0.5) for i in range(300)]
    await asyncio.gather(*(q.open() for q in queues))
    runtime = runtime_for(client)
    assert runtime is not None
    assert runtime.safety_poll is not None
    # Three safety-poll rounds of 300 queues (two pipelined reads each; 0.5 s apart, a slow machine
    # takes longer per round).
    await until(lambda: runtime.safety_poll.polls >= 6, timeout_s=15)
    assert sum(q.stats.transfer_errors for q in queues) == 0  # the pool (40) was never exhausted
    assert runtime.subscriber.channels == 300
    pool = client.connection_pool
    # The client's background calls share TRANSFER_SLOTS connections; + pub/sub + the eviction check's.
    assert len(pool._available_connections) + len(pool._in_use_connections) <= TRANSFER_SLOTS + 2


async def test_closing_2000_queues_at_once_is_quick_quiet_and_loses_nothing(
        qname: str, client: Redis, make_client: Any, make_queue: Any, caplog: pytest.LogCaptureFixture) -> None:
    shared = make_client()  # redis-py's default pool: 100 connections
    queues = [make_queue(f"{qname}:{i}", redis=shared) for i in range(2000)]
    consumed = queues[:100]
    await asyncio.gather(*(q.open() for q in queues))
    await asyncio.gather(*(q.offer_many([(i, 0) for i in range(20)]) for q in consumed))
    taken: dict[str, list[int]] = {q.name: [] for q in consumed}

    async def consume(q: DelayedQueue[int]) -> None:
        with contextlib.suppress(QueueClosedError):
            while True:
                taken[q.name].append(await q.take())
                await asyncio.sleep(0.05)  # slower than delivery: pumps hold prefetched items at the close

    takers = [asyncio.create_task(consume(q)) for q in consumed]
    await until(lambda: sum(map(len, taken.values())) >= 300, timeout_s=30)
    loop = asyncio.get_running_loop()
    with caplog.at_level(logging.WARNING, logger="aiodelayq"):
        started = loop.time()
        await asyncio.wait_for(asyncio.gather(*(q.aclose() for q in queues)), 60)
        elapsed = loop.time() - started
        await asyncio.wait_for(asyncio.gather(*takers), 10)  # each ends with QueueClosedError
    # "Does not hang" (the defect took 24-37 s); the time itself is a bar of -s bench, scenario idle.
    assert elapsed < 15
    assert [r.getMessage() for r in caplog.records if r.name == "aiodelayq"] == []
    assert runtime_for(shared) is None
    # Nothing lost, nothing doubled: what was taken and what is back in the list is every item once.
    for q in consumed:
        back = [json.loads(raw) for raw in await client.lrange(q.keys.destination, 0, -1)]
        assert sorted(taken[q.name] + back) == list(range(20)), q.name
        # Every pop was settled by the close; a pop cut off in flight leaves an empty tombstone (so
        # that it pops nothing should it still arrive), cleared when its lease ends.
        assert set((await client.hgetall(q.keys.handoff)).values()) <= {b""}
