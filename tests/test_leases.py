"""Leases of reliable deliveries: extend(), async with msg.lease(), and expiry when the holder dies."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import textwrap
from collections.abc import AsyncIterator
from typing import Any

import pytest
from redis.asyncio import Redis

from aiodelayq import InvalidDelayError, Message
from tests.helpers import first_line, server_ms


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


async def test_a_lapsed_delivery_cannot_be_extended(make_queue: Any) -> None:
    async with received(make_queue, "job", 0.2) as (q, first):
        second = await q.receive(visibility_timeout=30, timeout=5)  # after 0.2 s: delivered again
        assert second is not None
        assert second.delivery_count == 2
        assert not await first.extend(30)
        assert await second.ack()


async def test_a_lease_keeps_a_long_job_and_stops_at_exit(client: Redis, make_queue: Any) -> None:
    # A timeout of 0.9 s: a busy machine's loop may lag a few hundred ms without losing the lease.
    async with received(make_queue, "long", 0.9) as (q, msg):
        async with msg.lease() as lease:  # extends every 0.3 s by 0.9 s
            await asyncio.sleep(2.0)  # over two timeouts long
            assert await q.receive(visibility_timeout=30, timeout=0.01) is None
        assert lease.extensions >= 4
        assert not lease.lost
        extended = lease.extensions
        await asyncio.sleep(0.3)
        assert lease.extensions == extended  # stopped at exit
        assert await msg.ack(confirm=True)


async def test_a_cancelled_block_stops_its_lease(make_queue: Any) -> None:
    async with received(make_queue, "job", 0.3) as (q, msg):
        lease = msg.lease()

        async def job() -> None:
            async with lease:
                await asyncio.sleep(30)

        task = asyncio.ensure_future(job())
        await asyncio.sleep(0.25)
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
            await asyncio.sleep(0.5)
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
