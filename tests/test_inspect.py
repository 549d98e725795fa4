"""What on-call people read: counts() (one atomic call) and peek() (the soonest due, decoded, keyed)."""

from __future__ import annotations

from typing import Any

import pytest
from redis.asyncio import Redis

from aiodelayq import ConfigurationError, QueueCounts
from tests.helpers import until


async def test_counts_reads_every_part_of_a_queue(client: Redis, make_queue: Any) -> None:
    q = make_queue(codec="json", max_deliveries=1)
    assert await q.counts() == QueueCounts(0, 0, 0, 0, None)
    later = await q.offer({"n": 1}, 60)
    await q.offer({"n": 2}, 120)
    for n in range(3):
        await q.offer({"ready": n}, 0)
    await client.rpush(q.keys.dead_letter, b"garbage")
    async with q:
        await until(lambda: _ready_is(q, 3))
        message = await q.receive(30)
        assert message is not None
        counts = await q.counts()
        assert counts == QueueCounts(pending=2, ready=2, in_flight=1, dead_letters=1, next_due_ms=int(later))
        await message.ack(confirm=True)
    assert (await q.counts()).in_flight == 0


async def _ready_is(q: Any, n: int) -> bool:
    return bool(await q.ready_size() == n)


@pytest.mark.parametrize("strict", [False, True])
async def test_peek_lists_the_soonest_due_with_keys(client: Redis, make_queue: Any, strict: bool) -> None:
    q = make_queue(codec="json", strict=strict)
    third = await q.offer({"n": 3}, 300)
    first = await q.offer({"n": 1}, 100, key="order-1")
    second = await q.offer({"n": 2}, 200)
    await q.offer({"n": 4}, 400, key="order-4")
    items = await q.peek(3)
    assert [(i.due_ms, i.value, i.key) for i in items] == [
        (int(first), {"n": 1}, "order-1"), (int(second), {"n": 2}, None), (int(third), {"n": 3}, None)]
    assert all(i.decodable and not i.malformed for i in items)
    assert items[0].raw == b'{"n":1}'
    assert len(await q.peek(1000)) == 4


async def test_peek_shows_undecodable_and_malformed_raw(client: Redis, make_queue: Any) -> None:
    q = make_queue(codec="json")
    raw_q = make_queue(codec="bytes")
    due = await raw_q.offer(b"\xffnot json", 100)
    await client.zadd(q.keys.timeout_set, {b"junk": int(due) + 1})
    undecodable, malformed = await q.peek(5)
    assert (undecodable.value, undecodable.raw, undecodable.decodable, undecodable.malformed) == (
        None, b"\xffnot json", False, False)
    assert (malformed.raw, malformed.malformed, malformed.due_ms) == (b"junk", True, int(due) + 1)


@pytest.mark.parametrize("limit", [0, 1001, -1, 2.0, True])
async def test_peek_rejects_a_bad_limit(make_queue: Any, limit: Any) -> None:
    with pytest.raises(ConfigurationError):
        await make_queue().peek(limit)
