"""The controls every consumer obeys, in every process: pause/resume and a rate limit held across
consumers; what they cost an idle consumer, where they show (counts, the CLI, the metrics), and bad
input refused with nothing written."""

from __future__ import annotations

import asyncio
import math
import time
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

from aiodelayq import ConfigurationError, DelayedQueue, QueueCounts
from tests.helpers import llen_is, receivers_waiting, script_calls, takers_waiting, until

# A worker in another process: prints "ready", then "got <item>" per item it handles, until the
# stop key exists.
WORKER_PROCESS = r"""
import asyncio, sys
from redis.asyncio import Redis
from aiodelayq import DelayedQueue

url, name, stop_key = sys.argv[1], sys.argv[2], sys.argv[3]


async def main():
    client = Redis.from_url(url)
    try:
        async with DelayedQueue(client, name) as q:
            async def handle(item):
                print("got", item, flush=True)

            worker = q.worker(handle, concurrency=4)
            running = asyncio.create_task(worker.run())
            print("ready", flush=True)
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 90  # never outlive the test
            while not await client.exists(stop_key) and loop.time() < deadline:
                await asyncio.sleep(0.02)
            worker.stop()
            await running
    finally:
        await client.aclose()


asyncio.run(main())
"""


async def test_a_pause_holds_every_consumer_in_every_process_while_offers_and_transfers_go_on(
        redis_server: Any, client: Redis, make_client: Any, make_queue: Any, qname: str, drop_keys: Any,
        spawn_consumer: Any) -> None:
    stop_key = f"{qname}:stop"
    drop_keys(stop_key)
    taker: DelayedQueue[int] = make_queue()
    receiver: DelayedQueue[int] = make_queue(redis=make_client())
    await taker.pause()
    child = spawn_consumer(WORKER_PROCESS, args=[redis_server.url, qname, stop_key])
    await child.await_line("ready", timeout_s=60)
    got: list[tuple[str, int, float]] = []

    async def take() -> None:
        while True:
            got.append(("take", await taker.take(), time.monotonic()))

    async def receive() -> None:
        async for message in receiver.messages(30):
            got.append(("receive", message.value, time.monotonic()))
            await message.ack()

    async with taker, receiver:
        consumers = [asyncio.create_task(take()), asyncio.create_task(receive())]
        await until(lambda: takers_waiting(taker) and receivers_waiting(receiver))
        n = 30
        await taker.offer_many([(i, 0.05) for i in range(n)])  # offers are accepted while paused
        await until(lambda: llen_is(client, taker, n))  # and due items move to the ready list
        await asyncio.sleep(1.5)  # three rechecks of every consumer: nothing handed out meanwhile
        assert got == []
        assert not [line for line in child.lines if line.startswith("got")]
        counts = await taker.counts()
        assert counts.paused
        assert counts.ready == n
        assert await receiver.is_paused()
        resumed = time.monotonic()
        await receiver.resume()
        assert not await taker.is_paused()

        def in_child() -> list[int]:
            return [int(line.split()[1]) for line in child.lines if line.startswith("got")]

        await until(lambda: len(got) + len(in_child()) >= n, timeout_s=10)  # does not hang
        restart_s = min(t for _, _, t in got) - resumed if got else None
        await client.set(stop_key, 1)
        assert await child.await_exit(30) == 0, child.stderr
        for task in consumers:
            task.cancel()
        await asyncio.gather(*consumers, return_exceptions=True)
    delivered = sorted([item for _, item, _ in got] + in_child())
    assert delivered == list(range(n)), delivered  # none lost, none doubled
    assert restart_s is None or restart_s < 5.0


async def test_a_paused_waiting_consumer_asks_about_twice_a_second_not_in_a_busy_loop(
        client: Redis, make_queue: Any) -> None:
    if isinstance(client, RedisCluster):
        pytest.skip("INFO commandstats of one server")
    q: DelayedQueue[int] = make_queue()
    await q.offer_many([(i, 0) for i in range(5)])
    await q.pause()
    async with q:
        taking = asyncio.create_task(q.take())
        receiving = asyncio.create_task(q.receive(30))
        await until(lambda: takers_waiting(q) and receivers_waiting(q))
        before, started = await script_calls(client), time.monotonic()
        await asyncio.sleep(2.0)
        calls, elapsed = await script_calls(client) - before, time.monotonic() - started
        assert not taking.done()
        assert not receiving.done()
        # Each of the two consumers asks once per PAUSED_RECHECK_S (0.5 s); the transfer task's transfers
        # come on top. A busy loop would be thousands.
        assert calls <= 4 * elapsed * 2 + 10, calls
        await q.resume()
        assert await asyncio.wait_for(taking, 10) in range(5)
        message = await asyncio.wait_for(receiving, 10)
        assert message is not None
        assert message.value in range(5)


async def test_a_rate_limit_is_held_by_all_consumers_together(client: Redis, make_client: Any,
                                                               make_queue: Any) -> None:
    rate, burst, n = 20.0, 5, 45
    one: DelayedQueue[int] = make_queue()
    two: DelayedQueue[int] = make_queue(redis=make_client())
    await one.set_rate_limit(rate, burst=burst)
    await one.offer_many([(i, 0) for i in range(n)])
    got: list[tuple[int, float]] = []

    async def take() -> None:
        while True:
            for item in await one.take_many(10):
                got.append((item, time.monotonic()))

    async def receive() -> None:
        while True:
            for message in await two.receive_many(10, 30):
                got.append((message.value, time.monotonic()))
                await message.ack()

    async with one, two:
        before = await script_calls(client) if not isinstance(client, RedisCluster) else 0
        consumers = [asyncio.create_task(take()), asyncio.create_task(receive())]
        await until(lambda: len(got) >= n, timeout_s=30)  # does not hang: about 2 s expected
        for task in consumers:
            task.cancel()
        await asyncio.gather(*consumers, return_exceptions=True)
        calls = await script_calls(client) - before if not isinstance(client, RedisCluster) else 0
        counts = await one.counts()
    assert sorted(item for item, _ in got) == list(range(n))  # none lost, none doubled
    times = sorted(t for _, t in got)
    # Never faster than the bucket: k items need (k - burst) / rate seconds at least (a lower bound,
    # which a slow machine cannot break; 50 ms for the consumers' round trips).
    for i in range(len(times)):
        for j in range(i + burst, len(times)):
            assert times[j] - times[i] >= (j - i + 1 - burst) / rate - 0.05, (i, j, times[j] - times[i])
    assert counts.rate_limit_per_s == rate
    assert counts.rate_burst == burst
    if calls:
        # Per item: a POP or RECEIVE of each consumer that wakes for its token, FINISH or SETTLE;
        # a busy loop would be thousands.
        assert calls <= n * 6 + 40, calls


async def test_a_rate_limit_of_none_removes_it_and_the_default_burst_is_a_seconds_worth(make_queue: Any) -> None:
    q: DelayedQueue[int] = make_queue()
    await q.set_rate_limit(2.5)
    counts = await q.counts()
    assert (counts.rate_limit_per_s, counts.rate_burst) == (2.5, 3)
    await q.set_rate_limit(None)
    assert await q.counts() == QueueCounts(0, 0, 0, 0, None)
    await q.offer_many([(i, 0) for i in range(50)])
    async with q:
        assert len(await q.take_many(50)) == 50


@pytest.mark.parametrize(("per_second", "burst", "named"), [
    (0, None, "per_second"), (-1, None, "per_second"), (math.nan, None, "per_second"),
    (math.inf, None, "per_second"), (True, None, "per_second"), ("10", None, "per_second"),
    (10, 0, "burst"), (10, 1.5, "burst"), (10, True, "burst"), (None, 0, "burst")])
async def test_a_bad_rate_limit_names_its_option_and_writes_nothing(make_queue: Any, client: Redis,
                                                                     per_second: Any, burst: Any, named: str) -> None:
    q: DelayedQueue[int] = make_queue()
    with pytest.raises(ConfigurationError, match=named):
        await q.set_rate_limit(per_second, burst)
    assert await client.exists(q.keys.controls) == 0
