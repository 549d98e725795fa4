"""Sharing a queue with Redisson: its elements are delivered by us, ours are moved and removed by it,
and both wire formats live in one queue."""

from __future__ import annotations

import asyncio
import os
import struct
from typing import Any

import pytest
from redis.asyncio import Redis

from tests import redisson_scripts as rs
from tests.helpers import server_ms


async def _redisson_offer(client: Redis, keys: Any, payload: bytes, delay_ms: int, legacy: bool) -> None:
    # Redisson computes the due time on the client (System.currentTimeMillis() + delay).
    due = int(await server_ms(client)) + delay_ms
    script = rs.OFFER_LEGACY if legacy else rs.OFFER_CURRENT
    random_id: Any = int.from_bytes(os.urandom(8), "big", signed=True) if legacy else os.urandom(8)
    await client.eval(script, 4, keys.destination, keys.timeout_set, keys.delay_list, keys.channel,
                      due, random_id, payload)


async def _redisson_transfer(client: Redis, keys: Any, legacy: bool) -> Any:
    script = rs.TRANSFER_LEGACY if legacy else rs.TRANSFER_CURRENT
    return await client.eval(script, 3, keys.destination, keys.timeout_set, keys.delay_list,
                             int(await server_ms(client)), 100)


@pytest.mark.parametrize("legacy", [False, True], ids=["redisson>=3.21.1", "redisson<3.21.1"])
async def test_elements_written_by_redisson_scripts_are_delivered(client: Redis, make_queue: Any,
                                                                  legacy: bool) -> None:
    q = make_queue(codec="str")
    for i in range(5):
        await _redisson_offer(client, q.keys, f"java-{i}".encode(), 100 + 50 * i, legacy)
    assert await q.size() == 5
    assert await q.read_all() == [f"java-{i}" for i in range(5)]
    assert await q.contains("java-3")
    assert await q.remove("java-4")
    async with q:
        got = [await asyncio.wait_for(q.take(), 5) for _ in range(4)]
    assert got == [f"java-{i}" for i in range(4)]


@pytest.mark.parametrize(("wire_format", "strict"), [("redisson", True), ("redisson-legacy", True),
                                                     ("redisson", False)])
async def test_redisson_scripts_move_and_remove_our_elements(client: Redis, make_queue: Any,
                                                             wire_format: str, strict: bool) -> None:
    legacy = wire_format == "redisson-legacy"
    q = make_queue(codec="str", wire_format=wire_format, strict=strict)
    await q.offer_many([("a", 0), ("b", 0), ("c", 0), ("later", 60)])
    await asyncio.sleep(0.01)
    remove = rs.REMOVE_LEGACY if legacy else rs.REMOVE_CURRENT
    # Redisson's remove() scans its insertion-order list: it sees strict elements only (documented).
    assert await client.eval(remove, 2, q.keys.delay_list, q.keys.timeout_set, b"b") == int(strict)
    if not strict:
        assert await q.remove("b")
    next_due = await _redisson_transfer(client, q.keys, legacy)
    assert next_due is not None  # "later" is still pending
    assert sorted(await client.lrange(q.keys.destination, 0, -1)) == [b"a", b"c"]
    assert await q.read_all() == ["later"]


async def test_both_wire_formats_in_one_queue(client: Redis, make_queue: Any, qname: str) -> None:
    current = make_queue(codec="str", strict=True)
    legacy = make_queue(codec="str", wire_format="redisson-legacy")
    fast = make_queue(codec="str")
    await current.offer("new-1", 0.05)
    await legacy.offer("old-1", 0.05)
    await _redisson_offer(client, current.keys, b"java-old", 50, legacy=True)
    await _redisson_offer(client, current.keys, b"java-new", 50, legacy=False)
    await current.offer("new-2", 60)
    await legacy.offer("old-2", 60)
    await fast.offer("fast-1", 0.05)
    await fast.offer("fast-2", 60)
    lengths = sorted(len(e) for e in await client.lrange(current.keys.delay_list, 0, -1))
    assert lengths == sorted([17 + 5, 16 + 5, 16 + 8, 17 + 8, 17 + 5, 16 + 5])
    assert await current.size() == 8
    got = await current.read_all()  # due order; the ~50 ms group may share milliseconds
    assert sorted(got[:5]) == sorted(["new-1", "old-1", "java-old", "java-new", "fast-1"])
    assert sorted(got[5:]) == sorted(["new-2", "old-2", "fast-2"])
    assert await current.remove("fast-2")
    assert await legacy.contains("new-2")
    assert await current.contains("old-2")
    assert await current.remove("old-2")
    assert await legacy.remove("new-2")
    async with current:
        got = {await asyncio.wait_for(current.take(), 5) for _ in range(5)}
    assert got == {"new-1", "old-1", "java-old", "java-new", "fast-1"}
    assert await current.size() == 0


async def test_lengths_are_checked_so_formats_are_never_confused(client: Redis, make_queue: Any) -> None:
    q = make_queue(codec="bytes")
    # A legacy element whose random double starts with byte 8 and whose payload is 16+ bytes: a
    # reader that only looked at the first byte would take it for the current format.
    payload = b"P" * 20
    legacy_like = struct.pack("<dQ", struct.unpack("<d", b"\x08" + os.urandom(7))[0], len(payload)) + payload
    assert legacy_like[0] == 8
    # A current element whose payload starts like a legacy length field.
    current = b"\x08" + os.urandom(8) + struct.pack("<Q", 9) + struct.pack("<Q", 1) + b"x"
    await client.rpush(q.keys.delay_list, legacy_like, current)
    await client.zadd(q.keys.timeout_set, {legacy_like: 1, current: 2})
    assert await q.read_all() == [payload, struct.pack("<Q", 1) + b"x"]
    async with q:
        assert await q.take() == payload
        assert await q.take() == struct.pack("<Q", 1) + b"x"
    assert await q.dead_letters() == []


async def test_redisson_remove_cancels_redisson_offers_in_a_queue_we_serve(client: Redis, make_queue: Any) -> None:
    q = make_queue(codec="str")
    async with q:
        await _redisson_offer(client, q.keys, b"java-cancel-me", 300, legacy=False)
        await _redisson_offer(client, q.keys, b"java-keep", 300, legacy=False)
        await q.offer("python-fast", 0.3)
        assert await client.eval(rs.REMOVE_CURRENT, 2, q.keys.delay_list, q.keys.timeout_set, b"java-cancel-me") == 1
        got = {await asyncio.wait_for(q.take(), 5) for _ in range(2)}
        assert got == {"java-keep", "python-fast"}
        assert await q.poll(0.2) is None
    assert await client.llen(q.keys.delay_list) == 0  # our transfer LREMed Java's element as Redisson does
