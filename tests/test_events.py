"""A queue's event stream: one entry per change to an item, appended by the script that makes it,
read back with ``events()``; off, nothing is written."""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import pytest
from redis.asyncio import Redis

from aiodelayq import ConfigurationError, DelayedQueue, QueueEvent
from tests.helpers import server_ms


async def _stored(q: Any, start: str = "0") -> list[QueueEvent]:
    return [e async for e in q.events(start, follow=False)]


def _kinds(events: list[QueueEvent]) -> list[str]:
    return [e.kind for e in events]


async def test_one_items_life_in_order(client: Redis, make_queue: Any) -> None:
    q = make_queue(codec="json", max_deliveries=2)
    await q.set_events(1000)
    before = await server_ms(client)
    await q.offer({"order": 1}, 0, key="order-1", group="tenant-a")
    async with q:
        first = await q.receive(30, timeout=5)
        assert first is not None
        assert await first.nack()
        again = await q.receive(30, timeout=5)
        assert again is not None
        assert again.delivery_count == 2
        await again.nack()  # the last allowed delivery: dead-lettered
    events = await _stored(q)
    assert _kinds(events) == ["offered", "delivered", "nacked", "delivered", "dead_lettered"]
    offered, delivered, nacked, redelivered, dead = events
    assert (offered.key, offered.group, offered.message_id) == ("order-1", "tenant-a", None)
    assert delivered.message_id == first.id == nacked.message_id == redelivered.message_id == dead.message_id
    assert [e.delivery_count for e in events[1:]] == [1, 1, 2, 2]
    assert {e.group for e in events} == {"tenant-a"}
    assert [e.reason for e in events] == [None, None, None, None, "max_deliveries"]
    assert [e.at_ms for e in events] == sorted(e.at_ms for e in events)
    assert before - 1000 <= events[0].at_ms <= events[-1].at_ms <= await server_ms(client) + 1000
    assert all(e.id == f"{e.at_ms}-{e.id.split('-')[1]}" for e in events)


async def test_offered_then_cancelled_rescheduled_deduplicated_and_acked(client: Redis, make_queue: Any) -> None:
    q = make_queue(codec="json")
    await q.set_events(1000)
    await q.offer("a", 60, key="k")
    assert (await q.offer("b", 60, key="k")).deduplicated
    assert await q.reschedule("k", 120)
    assert await q.cancel("k")
    await q.offer("c", 0, key="w", dedupe_for=60)
    async with q:
        msg = await q.receive(30, timeout=5)
        assert msg is not None
        assert await msg.ack(confirm=True)
        assert await q.poll(0.1) is None
    assert (await q.offer("d", 0, key="w")).deduplicated
    events = await _stored(q)
    assert [(e.kind, e.key) for e in events] == [
        ("offered", "k"), ("deduplicated", "k"), ("rescheduled", "k"), ("cancelled", "k"), ("offered", "w"),
        ("delivered", None), ("acked", None), ("deduplicated", "w")]
    assert events[5].message_id == events[6].message_id == msg.id
    assert [(e.delivery_count, e.reason) for e in events[5:7]] == [(1, None), (1, None)]


async def test_take_expiry_dead_letters_and_requeue(client: Redis, make_queue: Any) -> None:
    q = make_queue(codec="json")
    await q.set_events(1000)
    await q.offer("gone", 0, expires=0.001)
    await q.offer("taken", 0)
    await asyncio.sleep(0.05)
    async with q:
        assert await q.poll(5) == "taken"
        msg = await q.receive(30, timeout=1)
        assert msg is None
    assert await q.requeue_dead_letters() == 1
    kinds = _kinds(await _stored(q))
    assert kinds[:2] == ["offered", "offered"]
    assert sorted(kinds[2:4]) == ["delivered", "expired"]
    assert kinds[4:] == ["requeued"]
    expired = next(e for e in await _stored(q) if e.kind == "expired")
    assert expired.reason == "expired"


async def test_follow_sees_another_process_event_at_once(client: Redis, make_queue: Any, single_server: Any) -> None:
    q = make_queue(codec="json")
    await q.set_events(1000)
    seen: list[tuple[QueueEvent, float]] = []
    got = asyncio.Event()

    async def follow() -> None:
        async for event in q.events():
            seen.append((event, await server_ms(client)))
            got.set()

    follower = asyncio.create_task(follow())
    await asyncio.sleep(0.3)  # the follower is reading from "$"
    code = ("import asyncio, redis.asyncio as r, aiodelayq\n"
            "async def main():\n"
            f"    c = r.Redis.from_url({single_server.url!r})\n"
            f"    await aiodelayq.DelayedQueue(c, {q.name!r}).offer('from afar', 60, key='afar')\n"
            "    await c.aclose()\n"
            "asyncio.run(main())\n")
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", code)
    assert await asyncio.wait_for(proc.wait(), 60) == 0
    await asyncio.wait_for(got.wait(), 10)
    follower.cancel()
    with pytest.raises(asyncio.CancelledError):
        await follower
    ((event, seen_at),) = seen
    assert (event.kind, event.key) == ("offered", "afar")
    assert seen_at - event.at_ms <= 100  # seen within 100 ms of its write (server clock)


async def test_the_cap_holds_and_off_deletes_the_stream(client: Redis, make_queue: Any) -> None:
    q = make_queue(codec="json")
    await q.set_events(100)
    for _ in range(5):
        await q.offer_many([(n, 60) for n in range(100)])
    assert 100 <= await client.xlen(q.keys.event_stream) <= 200  # about maxlen, give or take a node
    await q.set_events(None)
    assert await client.exists(q.keys.event_stream) == 0
    await q.offer(1, 60)
    assert await client.exists(q.keys.event_stream) == 0


async def test_off_writes_nothing(own_server: Any, make_client: Any) -> None:
    client = make_client(own_server())
    q: DelayedQueue[str] = DelayedQueue(client, "off", codec="json", max_deliveries=1)
    await q.offer("a", 0, key="a", group="g")
    await q.offer("b", 60, key="b")
    assert (await q.offer("b", 60, key="b")).deduplicated
    await q.reschedule("b", 30)
    await q.cancel("b")
    async with q:
        msg = await q.receive(30, timeout=5)
        assert msg is not None
        assert await msg.nack()  # the last delivery: dead-lettered
    await q.requeue_dead_letters()
    stats = await client.info("commandstats")
    assert "cmdstat_xadd" not in stats
    assert await client.exists(q.keys.event_stream) == 0


async def test_bad_input_is_refused_naming_it(client: Redis, make_queue: Any) -> None:
    q = make_queue(codec="json")
    for bad in (0, -1, 1.5, True, "10"):
        with pytest.raises(ConfigurationError, match="maxlen"):
            await q.set_events(bad)
    with pytest.raises(ConfigurationError, match="start"):
        await _stored(q, "yesterday")
    assert await client.hget(q.keys.controls, "events") is None
