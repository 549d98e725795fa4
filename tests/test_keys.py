"""Keys of pending items: dedupe, replace, cancel, reschedule, get; the index stays exact."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from redis.asyncio import Redis

from aiodelayq import InvalidKeyError, Offered, Pending
from aiodelayq._wire.item_keys import key_tag
from tests.helpers import server_ms


async def _index_keys(client: Redis, q: Any) -> int:
    return int(await client.hlen(q.keys.key_index))


@pytest.mark.parametrize("strict", [False, True])
async def test_a_key_dedupes_until_its_item_falls_due(client: Redis, make_queue: Any, strict: bool) -> None:
    q = make_queue(codec="json", strict=strict)
    first = await q.offer({"order": 42}, 60, key="order-42")
    assert isinstance(first, Offered)
    assert (first.added, first.replaced, first.key) == (True, False, "order-42")
    again = await q.offer({"order": "other"}, 5, key="order-42")
    assert (again.added, again.replaced) == (False, False)
    assert int(again) == int(first)  # the pending item's due time; nothing changed
    assert await q.size() == 1
    got = await q.get("order-42")
    assert got == Pending("order-42", {"order": 42}, int(first))
    assert await client.llen(q.keys.delay_list) == (1 if strict else 0)


@pytest.mark.parametrize("strict", [False, True])
async def test_replace_changes_payload_and_due_time(client: Redis, make_queue: Any, strict: bool) -> None:
    q = make_queue(codec="json", strict=strict)
    await q.offer("v1", 60, key="k")
    replaced = await q.offer("v2", 120, key="k", replace=True)
    assert (replaced.added, replaced.replaced) == (True, True)
    pending = await q.get("k")
    assert pending is not None
    assert (pending.value, pending.due_ms) == ("v2", int(replaced))
    assert await q.size() == 1
    assert await client.llen(q.keys.delay_list) == (1 if strict else 0)  # the old element left the list too
    assert await q.read_all() == ["v2"]


async def test_cancel_and_reschedule(client: Redis, make_queue: Any) -> None:
    q = make_queue(codec="json")
    await q.offer("a", 60, key="a")
    await q.offer("b", 60, key="b")
    assert await q.cancel("a") is True
    assert await q.cancel("a") is False
    assert await q.get("a") is None
    before = int(await server_ms(client))
    due = await q.reschedule("b", 0.2)
    assert due is not None
    assert before + 200 <= due <= await server_ms(client) + 200
    assert await q.reschedule("nope", 1) is None
    async with q:
        assert await asyncio.wait_for(q.take(), 5) == "b"
    assert await q.get("b") is None
    assert await q.cancel("b") is False  # delivered: nothing to cancel
    assert await _index_keys(client, q) == 0  # the transfer dropped its index entry


async def test_a_key_is_free_once_its_item_fell_due(client: Redis, make_queue: Any) -> None:
    q = make_queue(codec="json")
    await q.offer("first", 0.05, key="k")
    async with q:
        assert await asyncio.wait_for(q.take(), 5) == "first"
        second = await q.offer("second", 0.05, key="k")
        assert second.added  # not a duplicate: the first is no longer pending
        assert await asyncio.wait_for(q.take(), 5) == "second"
    assert await _index_keys(client, q) == 0


async def test_offer_many_with_keys_dedupes_within_and_across_calls(make_queue: Any) -> None:
    q = make_queue(codec="json")
    results = await q.offer_many([("x", 60), ("y", 60), ("z", 60), ("x2", 60)], keys=["kx", None, "kz", "kx"])
    assert [r.added for r in results] == [True, True, True, False]  # the 2nd "kx" found the first pending
    assert [r.key for r in results] == ["kx", None, "kz", "kx"]
    assert int(results[3]) == int(results[0])
    again = await q.offer_many([("x3", 30)], keys=["kx"], replace=True)
    assert again[0].replaced
    assert (await q.get("kx")).value == "x3"  # type: ignore[union-attr]
    assert await q.size() == 3


async def test_keyed_and_unkeyed_items_share_a_queue_and_keep_due_order(make_queue: Any) -> None:
    q = make_queue(codec="json")
    await q.offer_many([(i, 0.05 + i * 0.01) for i in range(0, 10, 2)])
    await q.offer_many([(i, 0.05 + i * 0.01) for i in range(1, 10, 2)], keys=[f"k{i}" for i in range(1, 10, 2)])
    async with q:
        got = [await asyncio.wait_for(q.take(), 5) for _ in range(10)]
    assert got == list(range(10))


async def test_bad_keys_write_nothing(client: Redis, make_queue: Any) -> None:
    q = make_queue(codec="json")
    for bad in ["", "x" * 1025, 42, b"bytes", "\ud800"]:
        with pytest.raises(InvalidKeyError):
            await q.offer("v", 1, key=bad)
    with pytest.raises(InvalidKeyError):
        await q.offer_many([("a", 1), ("b", 1)], keys=["one"])
    with pytest.raises(InvalidKeyError):
        await q.cancel("")
    assert await q.size() == 0
    assert await client.exists(q.keys.key_index) == 0


async def test_a_key_whose_tag_is_taken_goes_to_its_overflow_field(client: Redis, make_queue: Any) -> None:
    """A SHA-1 prefix collision, staged: the field of "b"'s tag holds another key's pending item."""
    q = make_queue(codec="json")
    await q.offer("o", 60, key="o")
    idx, tag_b = q.keys.key_index, key_tag(b"b")
    blob_o = await client.hget(idx, key_tag(b"o"))
    await client.hset(idx, tag_b, blob_o)  # as if "o" and "b" had the same tag
    first = await q.offer("b", 0.3, key="b")
    assert first.added
    assert await client.hget(idx, tag_b) == blob_o  # the other key's entry is untouched
    assert await client.hexists(idx, "overflow")
    b_element = next(m for m in await client.zrange(q.keys.timeout_set, 0, -1) if m.endswith(b'"b"'))
    assert b_element[13:21] == bytes((tag_b[0] & 0x7F,)) + tag_b[1:]  # no transfer drops "o"'s field
    got = await q.get("b")
    assert got is not None
    assert got.value == "b"
    assert (await q.offer("b2", 0.3, key="b")).added is False  # deduplicated from the overflow field
    replaced = await q.offer("b3", 0.3, key="b", replace=True)
    assert replaced.replaced
    async with q:
        assert await q.poll(5) == "b3"  # due: moved once, its key free again
    assert await q.get("b") is None
    assert await client.hget(idx, tag_b) == blob_o
    assert (await q.offer("b4", 60, key="b")).added
    assert await q.cancel("b")
    assert await q.get("b") is None
    assert (await q.get("o")) is not None  # "o" was never disturbed
    assert await q.size() == 1


async def test_stale_index_entries_are_ignored_and_swept(client: Redis, make_queue: Any) -> None:
    q = make_queue(codec="json")
    await q.offer_many([(i, 60) for i in range(20)], keys=[f"k{i}" for i in range(20)])
    # Redisson's transfer (or a remove by payload) takes elements without touching the index.
    await client.delete(q.keys.timeout_set)
    assert await _index_keys(client, q) == 20
    assert await q.get("k3") is None
    assert (await q.offer("new", 60, key="k3")).added  # a stale entry is not "pending"
    for i in range(40):  # each keyed call checks a few random entries
        await q.offer(i, 60, key=f"other-{i}")
    stale = 0
    for i in range(20):
        if i != 3 and await client.hexists(q.keys.key_index, key_tag(f"k{i}".encode())):
            stale += 1
    assert stale < 19  # being swept (each call probes 2 random entries)


async def test_a_resent_keyed_offer_answers_as_its_first_run(own_server: Any, make_proxy: Any, make_client: Any,
                                                            make_queue: Any) -> None:
    from aiodelayq._scripts import QueueScripts

    proxy = make_proxy(own_server())
    q = make_queue("keys-resend", redis=make_client(proxy), codec="json")
    await q.offer("warm", 60)  # OFFER loaded
    proxy.kill_after_send(QueueScripts.offer.sha.encode())  # applied, reply lost: the resend must not say "pending"
    first = await q.offer("v", 60, key="k")
    assert first.added
    assert proxy.killed == 1
    assert (await q.offer("w", 60, key="k")).added is False
    assert await q.size() == 2


async def test_cancel_or_deliver_never_both_never_neither(client: Redis, make_queue: Any) -> None:
    # Items fall due while they are cancelled: each is either delivered or cancelled, exactly once.
    q = make_queue(codec="json", safety_poll_s=300)
    n = 200
    async with q:
        await q.offer_many([(i, 0.05 + i * 0.001) for i in range(n)], keys=[f"k{i}" for i in range(n)])
        cancelled: set[int] = set()

        async def canceller() -> None:
            for i in range(n):
                if await q.cancel(f"k{i}"):
                    cancelled.add(i)
                await asyncio.sleep(0.0005)

        task = asyncio.ensure_future(canceller())
        delivered: list[int] = []
        while len(delivered) + len(cancelled) < n or not task.done():
            item = await q.poll(0.2)
            if item is not None:
                delivered.append(item)
            elif task.done() and len(delivered) + len(cancelled) >= n:
                break
        await task
    assert len(delivered) == len(set(delivered))
    assert not set(delivered) & cancelled
    assert set(delivered) | cancelled == set(range(n))
    assert await _index_keys(client, q) == 0
