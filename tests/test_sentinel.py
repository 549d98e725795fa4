"""Sentinel (issue 12): a ``Sentinel.master_for`` client through ``SENTINEL FAILOVER`` during a steady
offer/receive/ack load, with durable writes: no confirmed offer lost, delivery resumes by itself,
duplicates counted (an ack the old primary took but did not pass on brings the message again)."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Callable

import pytest
from redis.asyncio.sentinel import Sentinel

from aiodelayq import DelayedQueue
from aiodelayq.testing import ThrowawaySentinels
from tests.helpers import failover_report, longest_pause, until

pytestmark = pytest.mark.topology


async def test_a_sentinel_failover_under_load_loses_no_confirmed_offer(
        own_sentinels: Callable[..., ThrowawaySentinels]) -> None:
    setup = own_sentinels()
    sentinel = Sentinel(setup.sentinel_nodes, socket_timeout=2.0)
    client = sentinel.master_for(setup.service, socket_timeout=2.0)
    q: DelayedQueue[int] = DelayedQueue(client, f"aiodelayq-test:sentinel:{uuid.uuid4().hex[:10]}",
                                        min_replicas=1, replication_timeout_s=1.0, call_timeout_s=10.0)
    confirmed: list[int] = []
    failed: list[int] = []
    received: list[int] = []
    progress: list[tuple[float, int]] = []
    reasons: list[str] = []
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    async def produce() -> None:
        i = 0
        while not stop.is_set():
            try:
                await q.offer(i, 0.05)
                confirmed.append(i)
            except Exception as exc:  # counted: an offer may fail during the failover
                failed.append(i)
                reasons.append(f"{type(exc).__name__}: {str(exc)[:100]}")
            i += 1
            await asyncio.sleep(0.005)

    async def consume() -> None:
        while True:
            try:
                batch = await q.receive_many(50, 5, timeout=1)
            except Exception:  # the consumer keeps going through the failover
                await asyncio.sleep(0.1)
                continue
            for m in batch:
                received.append(m.value)
                progress.append((loop.time(), m.value))
                with contextlib.suppress(Exception):  # an ack lost in the failover: redelivered later
                    await m.ack()

    try:
        async with q:
            consumer = asyncio.create_task(consume())
            producer = asyncio.create_task(produce())
            await asyncio.sleep(1.0)
            old = setup.master_port()
            first_new, started = len(confirmed) + len(failed), loop.time()
            new = await asyncio.to_thread(setup.failover)
            promoted_after_s = loop.time() - started
            await until(lambda: any(v >= first_new for v in received), 20)
            await asyncio.sleep(1.0)  # load after the failover too
            stopped_at = loop.time()
            stop.set()
            await producer
            await until(lambda: set(confirmed) <= set(received), 20)
            consumer.cancel()
            await asyncio.gather(consumer, return_exceptions=True)
    finally:
        await client.aclose()
        for s in sentinel.sentinels:
            await s.aclose()
    lost = sorted(set(confirmed) - set(received))
    print("\n" + failover_report("sentinel", promoted_after_s, longest_pause(progress, started, stopped_at), confirmed,
                                  failed, reasons, lost, received))
    assert new != old
    assert lost == [], f"{len(lost)} confirmed offers lost: {lost[:20]}"
    assert len(confirmed) > 100
