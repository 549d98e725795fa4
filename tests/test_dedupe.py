"""Deduplication windows: a key stays taken for ``dedupe_for`` after the offer that wrote its item,
whatever became of the item; content deduplication; their storage and its trimming."""

from __future__ import annotations

import asyncio
import math
from datetime import timedelta
from typing import Any

import pytest
from redis.asyncio import Redis

from aiodelayq import InvalidDelayError, InvalidHeadersError, InvalidKeyError, Offered
from tests.helpers import server_ms


async def _window_keys(client: Redis, q: Any) -> tuple[int, int]:
    return int(await client.zcard(q.keys.dedupe_windows)), int(await client.hlen(q.keys.dedupe_dues))


async def test_a_key_stays_taken_for_its_window_after_its_item_is_acked(client: Redis, make_queue: Any) -> None:
    q = make_queue(codec="json")
    first = await q.offer({"order": 42}, 0, key="order-42", dedupe_for=60)
    assert (first.added, first.deduplicated) == (True, False)
    async with q:
        msg = await q.receive(30, timeout=5)
        assert msg is not None
        assert msg.value == {"order": 42}
        assert await msg.ack()
    again = await q.offer({"order": "retry"}, 0, key="order-42", dedupe_for=60)
    assert isinstance(again, Offered)
    assert (again.added, again.replaced, again.deduplicated, again.key) == (False, False, True, "order-42")
    assert int(again) == int(first)  # the due time of the item that took the key
    # Any offer of the key is refused in the window, with or without dedupe_for, replace or not.
    assert (await q.offer("x", 0, key="order-42")).deduplicated
    assert (await q.offer("x", 0, key="order-42", replace=True)).deduplicated
    assert await q.size() == 0
    assert await q.ready_size() == 0
    counts = await q.counts()
    assert (counts.deduplicating, counts.pending, counts.ready, counts.in_flight) == (1, 0, 0, 0)
    assert await q.get("order-42") is None  # a window is not a pending item


async def test_after_its_window_the_key_is_free(client: Redis, make_queue: Any) -> None:
    q = make_queue(codec="json")
    first = await q.offer("a", 0, key="k", dedupe_for=0.3)
    async with q:
        assert await q.poll(5) == "a"
    assert (await q.offer("b", 0, key="k", dedupe_for=0.3)).deduplicated
    before = await server_ms(client)
    await asyncio.sleep(max(0.0, (int(first) + 300 - before) / 1000) + 0.05)
    later = await q.offer("c", 60, key="k", dedupe_for=0.3)
    assert (later.added, later.deduplicated) == (True, False)
    assert (await q.get("k")).value == "c"  # type: ignore[union-attr]
    assert (await q.counts()).deduplicating == 1  # the new window


async def test_replace_in_the_window_replaces_while_pending_and_then_writes_nothing(client: Redis,
                                                                                   make_queue: Any) -> None:
    q = make_queue(codec="json")
    await q.offer("v1", 60, key="k", dedupe_for=60)
    replaced = await q.offer("v2", 0, key="k", replace=True, dedupe_for=60)
    assert (replaced.added, replaced.replaced, replaced.deduplicated) == (True, True, False)
    kept = await q.offer("v3", 60, key="k")  # pending: kept, as without a window
    assert (kept.added, kept.deduplicated, int(kept)) == (False, True, int(replaced))
    async with q:
        assert await q.poll(5) == "v2"
    gone = await q.offer("v4", 60, key="k", replace=True, dedupe_for=60)
    assert (gone.added, gone.replaced, gone.deduplicated) == (False, False, True)
    assert int(gone) == int(replaced)  # the window follows its last write
    assert await q.size() == 0


async def test_a_window_outlives_a_cancel_and_a_dead_letter(client: Redis, make_queue: Any) -> None:
    q = make_queue(codec="json", max_deliveries=1)
    await q.offer("a", 60, key="cancelled", dedupe_for=60)
    assert await q.cancel("cancelled")
    assert (await q.offer("a", 0, key="cancelled")).deduplicated
    await q.offer("b", 0, key="dead", dedupe_for=60)
    async with q:
        msg = await q.receive(30, timeout=5)
        assert msg is not None
        assert await msg.nack(dead_letter=True)
    assert len(await q.dead_letters()) == 1
    assert (await q.offer("b", 0, key="dead", dedupe_for=60)).deduplicated
    assert await q.size() == 0


async def test_offer_many_shares_one_window_and_a_repeated_key_is_refused(client: Redis, make_queue: Any) -> None:
    q = make_queue(codec="json")
    results = await q.offer_many([("a", 0), ("b", 0), ("a2", 0), ("free", 0)], keys=["a", "b", "a", None],
                                 dedupe_for=timedelta(minutes=1))
    assert [(r.added, r.deduplicated) for r in results[:3]] == [(True, False), (True, False), (False, True)]
    assert (results[3].key, results[3].added) == (None, True)
    async with q:
        got = {await q.poll(5) for _ in range(3)}
    assert got == {"a", "b", "free"}
    again = await q.offer_many([("a", 0), ("b", 0), ("c", 0)], keys=["a", "b", "c"], dedupe_for=60)
    assert [(r.added, r.deduplicated) for r in again] == [(False, True), (False, True), (True, False)]
    assert await _window_keys(client, q) == (3, 3)


async def test_content_deduplication_across_two_clients(make_client: Any, make_queue: Any) -> None:
    one = make_queue(redis=make_client(), codec="json")
    two = make_queue(redis=make_client(), codec="json")
    first = await one.offer({"webhook": 7, "body": "paid"}, 0, dedupe_by_content=True, dedupe_for=60,
                            headers={"source": "stripe", "attempt": "1"})
    assert first.added
    assert first.key is not None
    assert first.key.startswith("content:")
    assert len(first.key) == len("content:") + 32
    # The same payload and headers (in another order) from another client: refused.
    dup = await two.offer({"webhook": 7, "body": "paid"}, 5, dedupe_by_content=True, dedupe_for=60,
                          headers={"attempt": "1", "source": "stripe"})
    assert (dup.added, dup.deduplicated, dup.key, int(dup)) == (False, True, first.key, int(first))
    # Other headers or another payload: another key.
    other = await two.offer({"webhook": 7, "body": "paid"}, 0, dedupe_by_content=True, dedupe_for=60,
                            headers={"source": "stripe", "attempt": "2"})
    assert other.added
    assert other.key != first.key
    many = await two.offer_many([({"webhook": 7, "body": "paid"}, 0), ({"webhook": 8}, 0)],
                                headers=[{"source": "stripe", "attempt": "1"}, None], dedupe_by_content=True,
                                dedupe_for=60)
    assert [(r.added, r.deduplicated) for r in many] == [(False, True), (True, False)]
    assert await one.size() == 3


@pytest.mark.parametrize("bad", [0, -1, math.nan, math.inf, timedelta(0), "5"])
async def test_a_bad_window_is_refused_naming_it_and_nothing_is_written(client: Redis, make_queue: Any,
                                                                       bad: Any) -> None:
    q = make_queue(codec="json")
    with pytest.raises(InvalidDelayError, match="dedupe_for"):
        await q.offer("x", 0, key="k", dedupe_for=bad)
    with pytest.raises(InvalidDelayError, match="dedupe_for"):
        await q.offer_many([("x", 0)], keys=["k"], dedupe_for=bad)
    assert await q.size() == 0
    assert await client.exists(*q.keys.all) == 0


async def test_a_window_needs_a_key_and_content_excludes_one(client: Redis, make_queue: Any) -> None:
    q = make_queue(codec="json")
    with pytest.raises(InvalidKeyError, match="dedupe_for needs a key"):
        await q.offer("x", 0, dedupe_for=60)
    with pytest.raises(InvalidKeyError, match="dedupe_for needs a key"):
        await q.offer_many([("x", 0)], dedupe_for=60)
    with pytest.raises(InvalidKeyError, match="dedupe_by_content"):
        await q.offer("x", 0, key="k", dedupe_by_content=True, dedupe_for=60)
    with pytest.raises(InvalidKeyError, match="dedupe_by_content"):
        await q.offer_many([("x", 0)], keys=["k"], dedupe_by_content=True)
    with pytest.raises(InvalidHeadersError, match="headers"):
        await q.offer("x", 0, dedupe_by_content=True, headers={"a": 1})  # type: ignore[dict-item]
    with pytest.raises(InvalidHeadersError, match="headers"):
        await q.offer_many([("x", 0), ("y", 0)], dedupe_by_content=True, headers=[None])
    assert await client.exists(*q.keys.all) == 0


async def test_a_resent_offer_is_applied_once_and_not_counted_a_duplicate(own_server: Any, make_proxy: Any,
                                                                         make_client: Any, make_queue: Any) -> None:
    from aiodelayq._scripts import QueueScripts

    proxy = make_proxy(own_server())
    q = make_queue("dedupe-resend", redis=make_client(proxy), codec="json")
    await q.offer("warm", 60)  # OFFER loaded
    proxy.kill_after_send(QueueScripts.offer.sha.encode())  # applied, reply lost: the resend says "added"
    first = await q.offer("v", 0, key="k", dedupe_for=60)
    assert proxy.killed == 1
    assert (first.added, first.deduplicated) == (True, False)
    again = await q.offer("w", 0, key="k", dedupe_for=60)
    assert (again.added, again.deduplicated, int(again)) == (False, True, int(first))
    assert await q.size() + await q.ready_size() == 2  # "warm" and "v"
    assert (await q.counts()).deduplicating == 1


async def test_ended_windows_are_trimmed_by_offers_without_a_slow_call(own_server: Any, make_client: Any,
                                                                      make_queue: Any) -> None:
    server = own_server()
    client = make_client(server)
    await client.config_set("slowlog-log-slower-than", 5000)  # µs
    q = make_queue("dedupe-trim", redis=client, codec="json")
    n = 10_000
    await q.offer_many([(i, 3600) for i in range(n)], keys=[f"k{i}" for i in range(n)], dedupe_for=0.5)
    await q.clear()  # the items go; their windows stay
    assert await _window_keys(client, q) == (n, n)
    await asyncio.sleep(0.6)
    assert (await q.counts()).deduplicating == 0  # ended, not yet trimmed
    await client.slowlog_reset()
    offers = 0
    while await client.zcard(q.keys.dedupe_windows) > 0:  # every keyed offer trims a bounded number
        await q.offer_many([(f"t{offers}-{j}", 3600) for j in range(10)], keys=[f"t{offers}-{j}" for j in range(10)])
        offers += 1
        assert offers < n  # each trims at least 100
    assert await _window_keys(client, q) == (0, 0)
    assert offers <= n // 100 + 1
    assert await client.slowlog_get() == []


async def test_keyed_offers_without_a_window_write_no_window_keys(client: Redis, make_queue: Any) -> None:
    q = make_queue(codec="json")
    await q.offer("a", 60, key="a")
    await q.offer_many([("b", 60), ("c", 60)], keys=["b", None])
    assert await client.exists(q.keys.dedupe_windows, q.keys.dedupe_dues) == 0
    assert (await q.counts()).deduplicating == 0
