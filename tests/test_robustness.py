"""Regression tests for lifecycle and failure paths: timeouts, retries, stalls, races."""

from __future__ import annotations

import asyncio
import os
import signal
from typing import Any

import pytest
from redis.asyncio import Redis

from aiodelayq import QueueClosedError
from aiodelayq._connections import run_script
from aiodelayq._runtime import runtime_for
from aiodelayq._scripts.producer import OFFER
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
    # Three safety-poll rounds of 300 queues (0.5 s apart; a slow machine takes longer per round).
    await until(lambda: all(q.stats.transfers >= 3 for q in queues), timeout_s=15)
    assert sum(q.stats.transfer_errors for q in queues) == 0  # the pool (40) was never exhausted
    runtime = runtime_for(client)
    assert runtime is not None
    assert runtime.subscriber.channels == 300
