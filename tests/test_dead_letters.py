"""The dead-letter list: entries with their reason and count, entries others wrote, requeue, purge."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from redis.asyncio import Redis

from aiodelayq import ConfigurationError, DeadLetter
from aiodelayq._wire.elements import pack_dead_letter
from tests.helpers import server_ms, until


async def test_nack_to_the_dead_letter_list_says_why(client: Redis, make_queue: Any) -> None:
    q = make_queue(codec="json", max_deliveries=5)
    await q.offer({"order": 7}, 0)
    async with q:
        msg = await q.receive(visibility_timeout=30, timeout=5)
        assert msg is not None
        before = int(await server_ms(client))
        assert await msg.nack(dead_letter=True)
        assert not await msg.ack()
    [letter] = await q.dead_letters()
    assert isinstance(letter, DeadLetter)
    assert (letter.value, letter.reason, letter.delivery_count, letter.decodable) == ({"order": 7}, "nacked", 1, True)
    assert letter.dead_at_ms is not None
    assert before <= letter.dead_at_ms <= await server_ms(client)
    assert await client.zcard(q.keys.in_flight) == 0


async def test_entries_the_library_did_not_write_read_as_malformed(client: Redis, make_queue: Any) -> None:
    q = make_queue(codec="json")
    # Pushed by other code: a bare payload, garbage, a marker too short for an envelope.
    await client.rpush(q.keys.dead_letter, b'"bare"', b"\x00garbage", b"adq\x03")
    letters = await q.dead_letters()
    assert [(d.value, d.raw, d.reason, d.delivery_count, d.dead_at_ms) for d in letters] == [
        ("bare", b'"bare"', "malformed", None, None),
        (None, b"\x00garbage", "malformed", None, None),
        (None, b"adq\x03", "malformed", None, None),
    ]
    assert [d.decodable for d in letters] == [True, False, False]
    assert len(await q.dead_letters(limit=2)) == 2
    with pytest.raises(ConfigurationError):
        await q.dead_letters(limit=0)


@pytest.mark.parametrize("strict", [False, True])
async def test_requeue_puts_entries_back_oldest_first_and_skips_malformed(client: Redis, make_queue: Any,
                                                                        strict: bool) -> None:
    q = make_queue(codec="json", max_deliveries=1, strict=strict)
    await q.offer_many([(i, 0) for i in range(5)])
    async with q:
        for _ in range(5):
            msg = await q.receive(visibility_timeout=30, timeout=5)
            assert msg is not None
            assert await msg.nack()  # the last allowed delivery: dead-lettered
    await client.rpush(q.keys.dead_letter, b'"bare"')  # not an envelope: malformed, never requeued
    now = await server_ms(client)
    await client.zadd(q.keys.timeout_set, {b"junk-element": now - 10})  # a malformed element
    async with make_queue(q.name, codec="json"):  # its first transfer dead-letters the junk
        await until(lambda: _llen_is(client, q.keys.dead_letter, 7), timeout_s=5)
    letters = await q.dead_letters()
    assert [d.reason for d in letters] == ["max_deliveries"] * 5 + ["malformed", "malformed"]
    order = [d.value for d in letters[:5]]  # prefetch releases can reorder the deaths themselves
    assert await q.requeue_dead_letters(limit=2) == 2
    assert await q.requeue_dead_letters(delay=0.05) == 3  # the bare entry and the junk are skipped
    assert [d.reason for d in await q.dead_letters()] == ["malformed", "malformed"]
    assert await q.size() == 5
    assert await client.llen(q.keys.delay_list) == (5 if strict else 0)
    async with make_queue(q.name, codec="json") as consumer:
        got = [await asyncio.wait_for(consumer.take(), 5) for _ in range(5)]
    if strict:  # strict elements due in the same ms go in element-byte order (random ids), as Redisson's
        assert sorted(got[:2]) == sorted(order[:2])
        assert sorted(map(str, got[2:])) == sorted(map(str, order[2:]))
    else:  # fast elements keep their order (insertion stamps)
        assert got == order
    assert await q.purge_dead_letters() == 2
    assert await q.purge_dead_letters() == 0
    assert await q.requeue_dead_letters() == 0


async def test_requeue_in_pages_keeps_order(client: Redis, make_queue: Any, monkeypatch: Any) -> None:
    import aiodelayq._contents.dead_letters as dead

    monkeypatch.setattr(dead, "REQUEUE_PAGE", 7)
    q = make_queue(codec="json")
    await client.rpush(q.keys.dead_letter, *[pack_dead_letter(f"{i}".encode(), "nacked", 1, 0) for i in range(30)])
    assert await q.requeue_dead_letters(limit=25) == 25
    assert [d.value for d in await q.dead_letters()] == list(range(25, 30))
    async with q:
        got = [await asyncio.wait_for(q.take(), 5) for _ in range(25)]
    assert got == list(range(25))


async def test_a_resent_requeue_is_applied_once(own_server: Any, make_proxy: Any, make_client: Any,
                                               make_queue: Any) -> None:
    from aiodelayq._scripts import QueueScripts

    server = own_server()
    proxy = make_proxy(server)
    q = make_queue("requeue-resend", redis=make_client(proxy), codec="json")
    admin = make_client(server)
    await admin.rpush(q.keys.dead_letter, *[pack_dead_letter(raw, "nacked", 1, 0) for raw in (b"1", b"2", b"3")])
    await admin.script_load(QueueScripts.requeue.text)
    proxy.kill_after_send(QueueScripts.requeue.sha.encode())  # applied, reply lost: resent with the same call id
    assert await q.requeue_dead_letters() == 3
    assert proxy.killed == 1
    assert await q.size() == 3
    assert await admin.llen(q.keys.dead_letter) == 0


async def _llen_is(client: Redis, key: str, n: int) -> bool:
    return int(await client.llen(key)) == n
