"""Sentinel: a ``Sentinel.master_for`` client through ``SENTINEL FAILOVER`` during a steady
offer/receive/ack load, with durable writes: no confirmed offer lost, delivery resumes by itself,
duplicates counted (an ack the old primary took but did not pass on brings the message again)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable

import pytest
from redis.asyncio.sentinel import Sentinel

from aiodelayq import DelayedQueue
from aiodelayq.testing import ThrowawaySentinels
from tests.helpers import FailoverLoad, until

pytestmark = pytest.mark.topology


async def test_a_sentinel_failover_under_load_loses_no_confirmed_offer(
        own_sentinels: Callable[..., ThrowawaySentinels]) -> None:
    setup = own_sentinels()
    sentinel = Sentinel(setup.sentinel_nodes, socket_timeout=2.0)
    client = sentinel.master_for(setup.service, socket_timeout=2.0)
    q: DelayedQueue[int] = DelayedQueue(client, f"aiodelayq-test:sentinel:{uuid.uuid4().hex[:10]}",
                                        min_replicas=1, replication_timeout_s=1.0, call_timeout_s=10.0)
    loop = asyncio.get_running_loop()
    try:
        async with q, FailoverLoad(q) as load:
            await until(lambda: len(load.confirmed) >= 50, 20)  # the load runs (counted, not timed)
            old = setup.master_port()
            first_new, started = load.next_value, loop.time()
            new = await asyncio.to_thread(setup.failover)
            promoted_after_s = loop.time() - started
            await until(lambda: any(v >= first_new for v in load.received), 20)
            after = len(load.confirmed)
            await until(lambda: len(load.confirmed) >= after + 50, 20)  # load after the failover too
            stopped_at = await load.finish()
    finally:
        await client.aclose()
        for s in sentinel.sentinels:
            await s.aclose()
    print("\n" + load.report("sentinel", promoted_after_s, started, stopped_at))
    assert new != old
    assert load.lost == [], f"{len(load.lost)} confirmed offers lost: {load.lost[:20]}"
    assert len(load.confirmed) >= 100
