"""offer() and offer_many(): delays and due times (on the server's clock, counted from when the call was
issued), concurrent offers coalesced into shared script calls, codecs, bad input (nothing half-written),
resends after lost replies, and offers a server refuses or holds up."""

from __future__ import annotations

import asyncio
import json
import math
import os
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

from aiodelayq import (
    BackendError,
    CallTimeoutError,
    ConfigurationError,
    DelayedQueue,
    EncodeError,
    InvalidDelayError,
    ItemTooLargeError,
    QueueCounts,
    QueueFullError,
    delay_to_ms,
)
from aiodelayq._producing.call_cost import BUDGET_US, MAX_CALL_ITEMS, MIN_CALL_ITEMS, CallCost
from aiodelayq._redis.client_facts import facts_for
from aiodelayq._redis.connections import run_script
from aiodelayq._scripts import QueueScripts
from aiodelayq._wire.clock import STALE_S, ServerClock
from aiodelayq.testing import ThrowawayServer
from tests.faults import pause_server, stall_server
from tests.helpers import free_socket, queue_on, server_clock_at, server_ms

# -- delays and input ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("delay", "expected"), [
    (0, 0), (1, 1000), (0.1, 100), (0.0015, 2), (timedelta(minutes=30), 1_800_000),
    (timedelta(microseconds=1), 1), (2.5, 2500),
    # A positive delay never rounds down to "due now".
    (1e-9, 1), (0.0011, 2),
    # Long delays stay exact to the millisecond.
    (3600, 3_600_000), (1800.0, 1_800_000), (86_400, 86_400_000), (4e9, 4_000_000_000_000), (0.1 + 0.2, 300),
])
def test_delay_conversion_rounds_up_to_ms(delay: Any, expected: int) -> None:
    assert delay_to_ms(delay) == expected


@pytest.mark.parametrize("delay", [-1, -0.001, math.nan, math.inf, -math.inf, timedelta(seconds=-1),
                                   True, "5", None, 1e300])
async def test_bad_delay_raises_and_writes_nothing(client: Redis, make_queue: Any, delay: Any) -> None:
    q = make_queue()
    with pytest.raises(InvalidDelayError) as info:
        await q.offer("x", delay)
    assert isinstance(info.value, ValueError)
    with pytest.raises(InvalidDelayError):
        await q.offer_many([("ok", 1), ("bad", delay)])
    assert await client.exists(q.keys.timeout_set, q.keys.delay_list) == 0


async def test_unencodable_item_raises_codec_error_and_writes_nothing(client: Redis, make_queue: Any) -> None:
    q = make_queue()
    with pytest.raises(EncodeError):
        await q.offer(object(), 1)
    with pytest.raises(EncodeError):
        await q.offer({"nan": math.nan}, 1)
    with pytest.raises(EncodeError):
        await q.offer_many([({"ok": 1}, 1), ({1, 2}, 1)])
    with pytest.raises(EncodeError):
        await make_queue(codec="str").offer(b"not str", 1)
    with pytest.raises(EncodeError):
        await make_queue(codec="bytes").offer("not bytes", 1)
    assert await client.exists(q.keys.timeout_set, q.keys.delay_list) == 0


# -- codecs --------------------------------------------------------------------------------------------


class UpperCodec:
    def encode(self, obj: Any) -> bytes:
        return str(obj).upper().encode()

    def decode(self, data: bytes) -> str:
        return data.decode().lower()


@pytest.mark.parametrize(("codec", "items"), [
    ("json", [{"order": 1, "tags": ["a", "é"]}, [1, 2.5, None], "text", 7]),
    ("str", ["plain", "ünïcode", ""]),
    ("bytes", [b"\x00\xff raw", b"", bytes(range(256))]),
    ("msgpack", [{"a": [1, 2]}, b"bin", "s", 3.5]),
    (UpperCodec(), ["hello"]),
])
async def test_codecs_round_trip_through_redis(make_queue: Any, codec: Any, items: list[Any]) -> None:
    q = make_queue(codec=codec)
    await q.offer_many([(item, 0) for item in items])
    assert await q.read_all() == items
    async with q:
        got = [await q.take() for _ in items]
    assert sorted(map(repr, got)) == sorted(map(repr, items))


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(payloads=st.lists(st.binary(max_size=40), min_size=1, max_size=8),
       delays=st.lists(st.floats(min_value=0, max_value=0.05), min_size=8, max_size=8),
       name=st.text(min_size=1, max_size=20).filter(lambda s: s.strip() != ""),
       legacy=st.booleans())
def test_any_payload_name_and_delay_round_trip(single_server: Any, payloads: list[bytes], delays: list[float],
                                              name: str, legacy: bool) -> None:
    async def run() -> None:
        async with queue_on(single_server.url, f"aiodelayq-test:{os.urandom(4).hex()}:{name}", codec="bytes",
                            wire_format="redisson-legacy" if legacy else "redisson") as (_, q):
            await q.offer_many(list(zip(payloads, delays, strict=False)))
            assert sorted(await q.read_all()) == sorted(payloads)
            assert all([await q.contains(p) for p in payloads])
            async with q:
                got = [await asyncio.wait_for(q.take(), 5) for _ in payloads]
            assert sorted(got) == sorted(payloads)
            assert await q.dead_letters() == []

    asyncio.run(run())


# -- due times on the server's clock -----------------------------------------------------------------


async def test_offer_uses_the_server_clock(client: Redis, make_queue: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    import time

    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + 30.0)  # this producer's clock is 30 s fast
    q = make_queue()
    before = await server_ms(client)
    due = await q.offer("x", 10)
    after = await server_ms(client)
    assert before + 10_000 - 1 <= due <= after + 10_000 + 1
    [(_, score)] = await client.zrange(q.keys.timeout_set, 0, 0, withscores=True)
    assert score == due


# The client's estimate of the server clock, which gives a call its issue time (pure state).


def test_the_estimate_is_the_smallest_recent_upper_bound() -> None:
    clock = ServerClock()
    assert clock.server_ms(0.0) is None  # no reply yet: the script's clock is used
    # The server read 1 000 002 (whole ms: 1 000 002.0 to 1 000 002.999) between 10.000 and 10.004:
    # at 10.000 it was at most 1 000 002.999.
    clock.observe(sent=10.000, received=10.004, server_ms=1_000_002.0)
    assert clock.server_ms(10.0) == 1_000_002  # truncated as the server reads it; never behind
    clock.observe(sent=11.000, received=11.001, server_ms=1_000_999.0)  # a tighter bound, 3 ms lower
    assert clock.server_ms(12.0) == 1_001_999
    clock.observe(sent=12.000, received=12.010, server_ms=1_002_005.0)  # looser: ignored
    assert clock.server_ms(12.0) == 1_001_999


def test_a_server_clock_that_moved_ahead_restarts_the_estimate() -> None:
    clock = ServerClock()
    clock.observe(sent=1.0, received=1.001, server_ms=5_000.0)
    # 200 ms ahead of the estimate even at the reply's lower bound: a clock step or another node.
    clock.observe(sent=2.0, received=2.001, server_ms=6_200.0)
    assert clock.server_ms(2.0) == 6_200
    # Behind: the smaller upper bound wins at once.
    clock.observe(sent=3.0, received=3.001, server_ms=7_100.0)
    assert clock.server_ms(3.0) == 7_100


def test_a_stale_estimate_is_not_used() -> None:
    clock = ServerClock()
    clock.observe(sent=1.0, received=1.001, server_ms=5_000.0)
    assert clock.server_ms(1.0 + STALE_S) is not None
    assert clock.server_ms(1.002 + STALE_S) is None


# Due times count from when the call was issued, not from when its script ran: against a server
# whose commands are held.

DELAY_S = 60.0
DELAY_MS = 60_000


def _server_at(anchor: tuple[float, float], loop_time: float) -> float:
    return anchor[1] + (loop_time - anchor[0]) * 1000


async def _anchored(own_server: Any, make_client: Any, make_queue: Any, name: str, *,
                    warm: bool = True) -> tuple[Any, DelayedQueue[int], Redis, tuple[float, float]]:
    """A private server, a queue on a client of its own (its estimate anchored by one offer unless
    ``warm`` is false), an admin client, and an anchor of the server clock."""
    server = own_server()
    client, admin = make_client(server), make_client(server)
    q: DelayedQueue[int] = make_queue(name, redis=client)
    if warm:
        # The replies anchor the producer's estimate of the server clock; it keeps the tightest,
        # and the first one also paid for connecting and loading the script.
        for _ in range(3):
            await q.offer(-1, DELAY_S)
    # (loop time, server ms) read together: one slow reply would shift every expected due time.
    return server, q, admin, await server_clock_at(admin, asyncio.get_running_loop().time)


async def _offer_while_held(url: str, q: DelayedQueue[Any], hold_ms: int, n: int) -> tuple[list[int], float]:
    """Offer ``n`` items with ``offer_many`` while the server holds every command for ``hold_ms``;
    returns their due times and the loop time of the call."""
    await asyncio.to_thread(pause_server, url, hold_ms)
    issued = asyncio.get_running_loop().time()
    dues = await q.offer_many([(i, DELAY_S) for i in range(n)])
    return dues, issued


async def test_a_bulk_offer_held_up_by_the_server_counts_from_its_issue_time(
        own_server: Any, make_client: Any, make_queue: Any) -> None:
    server, q, admin, anchor = await _anchored(own_server, make_client, make_queue, "issued")
    dues, issued = await _offer_while_held(server.url, q, 400, 2500)  # three OFFER calls, all held
    expected = _server_at(anchor, issued) + DELAY_MS
    # Without the issue time every due would be >= 400 ms late; with it, within the measuring error
    # (the estimate's and the anchor's round trips, and a busy machine's lag).
    assert all(abs(due - expected) < 100 for due in dues), (min(dues) - expected, max(dues) - expected)
    scores = {int(s) for _, s in await admin.zrange(q.keys.timeout_set, 0, -1, withscores=True)}
    assert set(dues) <= scores  # what offer_many returned is what the zset holds


async def test_coalesced_offers_each_count_from_their_own_issue_time(
        own_server: Any, make_client: Any, make_queue: Any) -> None:
    server, q, _, anchor = await _anchored(own_server, make_client, make_queue, "coalesced")
    loop = asyncio.get_running_loop()
    await asyncio.to_thread(pause_server, server.url, 400)
    # Ten offers 25 ms apart while the server holds every call: the first two go out in calls of
    # their own (two in flight), the eight later ones wait and go out together in a third.
    offers, issued = [], []
    for i in range(10):
        issued.append(loop.time())
        offers.append(asyncio.ensure_future(q.offer(i, DELAY_S)))
        await asyncio.sleep(0.025)
    dues = await asyncio.gather(*offers)
    for due, at in zip(dues, issued, strict=True):
        assert abs(due - (_server_at(anchor, at) + DELAY_MS)) < 100, (due, _server_at(anchor, at) + DELAY_MS)
    assert dues == sorted(dues)


async def test_a_first_offer_without_an_estimate_counts_from_the_script(
        own_server: Any, make_client: Any, make_queue: Any) -> None:
    server, q, _, anchor = await _anchored(own_server, make_client, make_queue, "first", warm=False)
    dues, issued = await _offer_while_held(server.url, q, 400, 10)  # no reply has anchored this client yet
    assert min(dues) >= _server_at(anchor, issued) + DELAY_MS + 250  # held 400 ms; with an estimate, ~0


async def test_an_issue_time_older_than_a_second_is_not_trusted(
        own_server: Any, make_client: Any, make_queue: Any) -> None:
    server, q, _, anchor = await _anchored(own_server, make_client, make_queue, "stale")
    dues, issued = await _offer_while_held(server.url, q, 1300, 10)
    # Held 1.3 s: the script's own clock counts (the bound is 1 s), so the items are late, not early.
    assert min(dues) >= _server_at(anchor, issued) + DELAY_MS + 1000


async def test_the_calls_of_one_offer_many_share_one_base(own_server: Any, make_client: Any,
                                                          make_queue: Any) -> None:
    # The client's estimate of the server's clock is 500 ms ahead of it (as after a failover to a
    # server whose clock runs behind: an estimate is never behind the server), so each call would
    # count from its own clock. 10,000 items go out as ten calls: the first, then the others at once,
    # counting from the first one's base: items of one delay are due together, in list order
    # whichever call lands first, and not later than the server's clock says.
    server = own_server()
    client, admin = make_client(server), make_client(server)
    q: DelayedQueue[int] = make_queue("shared", redis=client)
    await q.offer(-1, 2 * DELAY_S)  # anchors the estimate
    loop = asyncio.get_running_loop()
    sent = loop.time()
    before = await server_ms(admin)
    facts_for(client).clock.observe(sent, loop.time(), int(before) + 500)
    dues = await q.offer_many([(i, DELAY_S) for i in range(10_000)])
    assert len(set(dues)) == 1
    assert before + DELAY_MS - 1 <= dues[0] <= await server_ms(admin) + DELAY_MS
    members = await admin.zrange(q.keys.timeout_set, 0, -1)
    assert [json.loads(m[29:]) for m in members] == [*range(10_000), -1]


# -- offer_many, and concurrent offers sharing script calls ----------------------------------------------


async def test_offer_many_is_one_round_trip_and_keeps_order(client: Redis, make_queue: Any) -> None:
    q = make_queue()
    await q.offer_many([])
    await q.offer("warm-up", 0)  # the first offer also asks the server for its 'L' layout, once
    await q.clear()
    calls_before = await _script_calls(client, q.keys.destination)
    dues = await q.offer_many([(i, 100 - i) for i in range(100)])
    assert await _script_calls(client, q.keys.destination) - calls_before == 1
    assert len(dues) == 100
    assert dues == sorted(dues, reverse=True)
    assert await q.size() == 100
    assert await q.read_all() == list(range(99, -1, -1))  # due order: item i is due in 100 - i s
    assert await q.offer_many([]) == []


async def test_offer_many_longer_than_one_script_call(make_queue: Any) -> None:
    q = make_queue()
    dues = await q.offer_many([(i, 60) for i in range(2500)])
    assert len(dues) == 2500
    assert await q.size() == 2500
    # Due order: the three calls run concurrently, so a later chunk may get the earlier server time.
    # Within one call the items share their due time and come in insertion order (the stamp).
    got = await q.read_all()
    assert sorted(got) == list(range(2500))
    for chunk in (range(0, 1000), range(1000, 2000), range(2000, 2500)):
        assert [i for i in got if i in chunk] == list(chunk)


async def _script_calls(client: Redis, key: str) -> int:
    """Script calls the server holding ``key`` has run (on a cluster, that key's primary)."""
    if isinstance(client, RedisCluster):
        await client.initialize()  # the slot map, before asking it for a node
        stats = await client.info("commandstats", target_nodes=client.get_node_from_key(key))
    else:
        stats = await client.info("commandstats")
    return sum(int(v["calls"]) for k, v in stats.items() if k in ("cmdstat_evalsha", "cmdstat_eval"))


async def test_concurrent_offers_share_round_trips_and_keep_their_own_results(client: Redis,
                                                                             make_queue: Any) -> None:
    q = make_queue()
    calls_before = await _script_calls(client, q.keys.destination)
    dues = await asyncio.gather(*(q.offer(i, i / 1000) for i in range(200)))
    calls = await _script_calls(client, q.keys.destination) - calls_before
    assert calls < 20  # coalesced, not one script call per offer
    assert await q.size() == 200
    # Each caller got its own item's due time: the one the zset holds for its payload (a fast
    # element ends with the payload; the calls may have different bases, so compare exactly).
    held = {json.loads(m[29:]): int(s) for m, s in await client.zrange(q.keys.timeout_set, 0, -1, withscores=True)}
    assert [held[i] for i in range(200)] == dues
    bad = [q.offer(i, 0) for i in range(3)] + [q.offer(object(), 0)]
    results = await asyncio.gather(*bad, return_exceptions=True)
    assert isinstance(results[3], EncodeError)  # only the bad offer fails
    assert all(isinstance(r, int) for r in results[:3])


def _count_calls(q: DelayedQueue[Any]) -> dict[str, Any]:
    """Wrap the producer's OFFER sender (the real one still runs) to record calls in flight."""
    producer = q._producer
    real = producer._send
    seen: dict[str, Any] = {"in_flight": 0, "most": 0, "sizes": []}

    async def counting(fragments: Any, issued: float, entries: Any, *, each: bool, grouped: bool = False) -> list[Any]:
        seen["in_flight"] += 1
        seen["most"] = max(seen["most"], seen["in_flight"])
        seen["sizes"].append(len(fragments))
        try:
            return await real(fragments, issued, entries, each=each, grouped=grouped)
        finally:
            seen["in_flight"] -= 1

    producer._send = counting  # type: ignore[method-assign]
    return seen


async def test_concurrent_offers_overlap_in_at_most_two_calls(client: Redis, make_queue: Any) -> None:
    q: DelayedQueue[int] = make_queue(codec="json")
    seen = _count_calls(q)

    async def caller(c: int) -> list[int]:
        return [await q.offer(c * 100 + i, 60) for i in range(20)]

    dues = await asyncio.gather(*(caller(c) for c in range(64)))
    assert seen["most"] == 2  # the server runs one call while the next is prepared, never more
    assert sum(seen["sizes"]) == 64 * 20
    assert max(seen["sizes"]) < 64  # split: not one call carrying every caller
    assert await q.size() == 64 * 20
    assert all(isinstance(d, int) for ds in dues for d in ds)


async def test_a_lone_offer_goes_out_alone_at_once(client: Redis, make_queue: Any) -> None:
    q: DelayedQueue[int] = make_queue(codec="json")
    seen = _count_calls(q)
    for i in range(3):
        await q.offer(i, 60)
    assert seen["sizes"] == [1, 1, 1]
    assert seen["most"] == 1


async def test_a_caller_cancelled_before_its_call_leaves_the_others_alone(client: Redis, make_queue: Any) -> None:
    q: DelayedQueue[int] = make_queue(codec="json")
    seen = _count_calls(q)
    tasks = [asyncio.ensure_future(q.offer(i, 60)) for i in range(40)]
    await asyncio.sleep(0)  # every offer is waiting: the first calls are out, the rest queued
    tasks[-1].cancel()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert isinstance(results[-1], asyncio.CancelledError)
    assert all(isinstance(r, int) for r in results[:-1])
    assert await q.size() == sum(seen["sizes"])
    assert 39 <= await q.size() <= 40  # the cancelled one only if its call had gone out


async def test_one_big_offer_does_not_fail_small_ones(own_server: Any, make_client: Any, make_queue: Any) -> None:
    client = make_client(own_server(**{"proto-max-bulk-len": "1mb"}))
    q: DelayedQueue[str] = make_queue("big", redis=client, codec="str")
    big = "x" * 100_000
    results = await asyncio.gather(*[q.offer(big, 60) for _ in range(11)],
                                   *[q.offer("tiny", 60) for _ in range(11)])
    assert len(results) == 22
    await q.offer_many([(big, 60)] * 12)
    assert await q.size() == 34


# -- size limits: max_item_bytes, capacity ---------------------------------------------------------


async def test_an_item_over_max_item_bytes_is_refused_before_anything_is_written(client: Redis,
                                                                                  make_queue: Any) -> None:
    q: DelayedQueue[str] = make_queue(codec="str", max_item_bytes=10)
    assert await q.offer("x" * 10, 60)  # exactly the bound: taken
    with pytest.raises(ItemTooLargeError, match=r"11 bytes as stored .*, over max_item_bytes=10"):
        await q.offer("x" * 11, 60)
    with pytest.raises(ItemTooLargeError, match="item 2 is"):
        await q.offer_many([("a", 60), ("b", 60), ("c" * 50, 60), ("d", 60)])
    with pytest.raises(ValueError, match="max_item_bytes"):  # an input error, as the builtin kind too
        await q.offer("y" * 11, 60, key="k")
    assert await client.zcard(q.keys.timeout_set) == 1


async def test_max_item_bytes_bounds_the_headers_and_envelope_too(client: Redis, make_queue: Any,
                                                                    qname: str) -> None:
    q: DelayedQueue[str] = make_queue(codec="str", max_item_bytes=64)
    headers = {"h": "x" * 16000}  # within MAX_HEADERS_BYTES
    with pytest.raises(ItemTooLargeError, match="over max_item_bytes=64"):
        await q.offer("small", 60, headers=headers)
    with pytest.raises(ItemTooLargeError, match="item 1 is"):
        await q.offer_many([("a", 60), ("b", 60)], headers=[None, headers])
    with pytest.raises(ItemTooLargeError, match="over max_item_bytes=64"):
        await q.offer("small", 60, headers={"h": "x" * 40}, expires=600)  # 40 + its envelope's 29 + ...
    with pytest.raises(ItemTooLargeError, match="over max_item_bytes=64"):
        await q.schedule("every", "small", every=60, headers=headers)
    assert await q.counts() == QueueCounts(0, 0, 0, 0, None)  # nothing pending, nothing recurring
    stored = await q.offer("small", 60, headers={"h": "x" * 8})  # within the bound with its envelope
    assert stored
    assert await client.zcard(q.keys.timeout_set) == 1


async def test_max_pending_counts_pending_and_ready_and_refuses_whole_calls(client: Redis, make_queue: Any) -> None:
    q: DelayedQueue[int] = make_queue(capacity=10)
    await q.offer_many([(i, 0) for i in range(4)])
    await client.rpush(q.keys.destination, b"5")  # ready items count too, whoever pushed them
    await q.offer_many([(i, 60) for i in range(4)])
    with pytest.raises(QueueFullError, match="capacity=10, room for 1 more") as refused:
        await q.offer_many([(i, 60) for i in range(2)])  # all or nothing
    assert refused.value.room == 1
    assert await client.zcard(q.keys.timeout_set) + await client.llen(q.keys.destination) == 9
    assert await q.offer(9, 60)
    with pytest.raises(QueueFullError, match="room for 0 more"):
        await q.offer(10, 60)
    async with q:  # taking makes room
        assert await q.take() in (0, 1, 2, 3, 5)
    assert await q.offer(10, 60)


async def test_max_pending_lets_a_key_replace_or_keep_its_item_but_refuses_a_new_key(client: Redis,
                                                                                     make_queue: Any) -> None:
    for strict in (False, True):
        q: DelayedQueue[str] = make_queue(name=f"limits-{strict}", codec="str", strict=strict, capacity=2)
        assert (await q.offer("a", 60, key="a")).added
        assert (await q.offer("b", 60, key="b")).added
        assert (await q.offer("a2", 60, key="a", replace=True)).replaced  # takes no room
        assert not (await q.offer("b2", 60, key="b")).added  # kept: nothing written
        with pytest.raises(QueueFullError):
            await q.offer("c", 60, key="c")
        with pytest.raises(QueueFullError):  # one new key in the call: refused whole, the replace too
            await q.offer_many([("a3", 60), ("d", 60)], keys=["a", "d"], replace=True)
        assert (await q.get("a")).value == "a2"  # type: ignore[union-attr]
        assert await q.get("d") is None
        assert await client.zcard(q.keys.timeout_set) == 2
        if strict:
            assert await client.llen(q.keys.delay_list) == 2  # Redisson's list: nothing half-written


async def test_concurrent_producers_cannot_overshoot_max_pending(client: Redis, make_client: Any,
                                                                 make_queue: Any) -> None:
    limit, producers, each = 75, 4, 50
    queues = [make_queue(capacity=limit, redis=make_client()) for _ in range(producers)]

    async def offer(q: DelayedQueue[int], i: int) -> bool:
        try:
            await q.offer(i, 60)
        except QueueFullError:
            return False
        return True

    # Concurrent offers of one queue object share script calls: each is admitted or refused alone.
    results = await asyncio.gather(*(offer(q, i) for q in queues for i in range(each)))
    assert sum(results) == limit
    assert await client.zcard(queues[0].keys.timeout_set) == limit
    with pytest.raises(QueueFullError):
        await queues[0].offer_many([(1, 60)])


async def test_under_max_pending_an_offer_many_is_one_call_all_or_nothing(client: Redis, make_queue: Any) -> None:
    q: DelayedQueue[int] = make_queue(capacity=2000, max_call_bytes=1024)  # would be many calls otherwise
    with pytest.raises(QueueFullError):
        await q.offer_many([(i, 60) for i in range(2001)])
    assert await client.zcard(q.keys.timeout_set) == 0
    assert len(await q.offer_many([(i, 60) for i in range(1500)])) == 1500
    assert await client.zcard(q.keys.timeout_set) == 1500


@pytest.mark.parametrize(("option", "value"), [("capacity", 0), ("capacity", True), ("capacity", 1.5),
                                               ("max_item_bytes", 0), ("max_item_bytes", "1k")])
def test_a_bad_size_limit_names_its_option(client: Redis, option: str, value: Any) -> None:
    with pytest.raises(ConfigurationError, match=option):
        DelayedQueue(client, "q", **{option: value})


# -- resends after a lost reply ------------------------------------------------------------------------


async def test_a_resent_offer_whose_reply_was_lost_is_delivered_once(own_server: Any, make_proxy: Any,
                                                                     make_client: Any, make_queue: Any) -> None:
    proxy = make_proxy(own_server())
    q: DelayedQueue[int] = make_queue("lost", redis=make_client(proxy), call_timeout_s=5.0)
    async with q:
        for i in range(10):
            proxy.kill_after_send(QueueScripts.offer.sha.encode())
            await q.offer(i, 0)  # the first send is applied, its reply lost, then resent
            assert await proxy.wait_killed_async(i + 1, 5)
        got = [await asyncio.wait_for(q.take(), 5) for _ in range(10)]
        assert sorted(got) == list(range(10))
        assert await q.poll(0.5) is None


async def test_a_resent_offer_call_writes_nothing_twice_even_after_transfer(client: Redis, make_queue: Any) -> None:
    q = make_queue()
    k = q.keys
    keys = [k.destination, k.timeout_set, k.delay_list, k.channel, k.calls, k.call_replies, k.key_index,
            k.controls]
    args = [os.urandom(16), "", "strict", "", "", 0, os.urandom(8), b'"job"']
    first = await run_script(client, QueueScripts.offer, keys, args, timeout_s=5)
    async with q:  # the element falls due and is transferred
        assert await asyncio.wait_for(q.take(), 5) == "job"
        again = await run_script(client, QueueScripts.offer, keys, args, timeout_s=5)  # as a resend after a lost reply
        assert again[:2] == [first[0], None]  # the same base; no clock reading (it is not a fresh run)
        assert await q.poll(0.3) is None
    assert await client.zcard(k.timeout_set) == 0
    assert await client.llen(k.delay_list) == 0


# -- a server that refuses or holds up an offer -----------------------------------------------------------


async def test_an_offer_under_maxmemory_fails_clearly_and_writes_nothing(own_server: Any, make_client: Any,
                                                                         make_queue: Any) -> None:
    client = make_client(own_server())
    q: DelayedQueue[str] = make_queue("full", redis=client)
    try:
        await q.offer("warm-up", 60)  # scripts loaded, layout known
        await client.config_set("maxmemory-policy", "noeviction")
        await client.config_set("maxmemory", "1")
        with pytest.raises(BackendError, match="maxmemory"):
            await q.offer("x", 1)
        with pytest.raises(BackendError, match="maxmemory"):
            await q.offer_many([(i, 1) for i in range(500)])
        await client.config_set("maxmemory", "0")
        assert await q.read_all() == ["warm-up"]  # nothing half-written
        assert await q.size() == 1
        assert await client.llen(q.keys.delay_list) == 0
    finally:
        await client.config_set("maxmemory", "0")


@pytest.mark.waits
async def test_an_offer_during_a_stall_fails_within_its_bound(debug_server: ThrowawayServer, make_client: Any,
                                                             make_queue: Any) -> None:
    client = make_client(debug_server)  # socket_timeout=None: redis-py alone would wait forever
    q: DelayedQueue[int] = make_queue("hang", redis=client, call_timeout_s=0.5)
    await q.offer(0, 60)  # connected and warmed up
    stall = stall_server(debug_server.url, 4.0)
    loop = asyncio.get_running_loop()
    start = loop.time()
    with pytest.raises(CallTimeoutError) as caught:
        await q.offer(1, 60)
    # Does not hang: 5x call_timeout_s (0.5 s), still before the 4 s stall ends.
    assert loop.time() - start < 2.5
    assert caught.value.maybe_applied
    stall.result(10)
    assert await q.offer(2, 60) > 0


def test_call_cost_sizes_calls_to_the_budget_within_bounds() -> None:
    cost = CallCost()
    assert cost.max_items == MAX_CALL_ITEMS  # a small zset's cost until a call was measured
    for _ in range(30):
        cost.observe(1000, 1000 * 20)  # 20 µs an item: a 10M-item zset on a slow machine
    assert cost.max_items == BUDGET_US // 20
    for _ in range(30):
        cost.observe(100, 100 * 1000)  # a server that stalls on every call: never below the floor
    assert cost.max_items == MIN_CALL_ITEMS
    for _ in range(30):
        cost.observe(1000, 100)
    assert cost.max_items == MAX_CALL_ITEMS
    for _ in range(30):
        cost.observe(1, 40)  # single offers: their time is the call's, not the item's
    assert cost.max_items == MAX_CALL_ITEMS


async def test_offer_many_splits_by_the_server_time_its_calls_cost(own_server: Any, make_client: Any,
                                                                   make_queue: Any) -> None:
    client = make_client(own_server())
    q: DelayedQueue[int] = make_queue("costly", redis=client)

    async def offer_calls(n: int) -> int:
        await client.config_resetstat()
        await q.offer_many([(i, 3600) for i in range(n)])
        stats = await client.info("commandstats")
        return int(stats["cmdstat_evalsha"]["calls"])

    await q.offer(-1, 3600)  # reads the server's long layout (a script call of its own)
    assert await offer_calls(MAX_CALL_ITEMS) == 1
    cost = q._producer._cost
    for _ in range(30):  # as if each item had cost 40 µs (a zset of millions, a loaded server)
        cost.observe(MAX_CALL_ITEMS, MAX_CALL_ITEMS * 40)
    most = cost.max_items
    assert most == BUDGET_US // 40
    assert await offer_calls(MAX_CALL_ITEMS) == math.ceil(MAX_CALL_ITEMS / most)
    assert await q.size() == 2 * MAX_CALL_ITEMS + 1
    assert cost.max_items != most  # the calls measured themselves: the estimate moved


@pytest.mark.parametrize("how", ["nothing listens", "TLS to a plain server"])
async def test_an_offer_that_never_connected_says_nothing_was_written(own_server: Any, how: str) -> None:
    if how == "nothing listens":
        with free_socket() as sock:  # bound, not listening: connections are refused
            port = sock.getsockname()[1]
            client = Redis(host="127.0.0.1", port=port)
            await _refused_offer(client)
    else:
        srv = own_server()
        client = Redis(host="127.0.0.1", port=srv.port, ssl=True, ssl_cert_reqs="none")
        await _refused_offer(client)
        plain = Redis.from_url(srv.url)
        assert await plain.keys("*") == []  # the handshake's bytes ran no command
        await plain.aclose()


async def _refused_offer(client: Redis) -> None:
    q: DelayedQueue[int] = DelayedQueue(client, "never", call_timeout_s=0.5, strict=True)
    try:
        with pytest.raises(BackendError) as caught:
            await asyncio.wait_for(q.offer(1, 60), 10)
        assert caught.value.maybe_applied is False, caught.value
        assert "may have been applied" not in str(caught.value), caught.value
    finally:
        await client.aclose()


async def test_an_offer_to_a_server_that_refuses_the_connection_says_what_it_did_and_what_failed(
        make_client: Any, make_queue: Any) -> None:
    with free_socket() as bound:  # bound, not listening: the connection is refused
        port = bound.getsockname()[1]
        q = make_queue(redis=make_client(f"redis://127.0.0.1:{port}/0"), call_timeout_s=1)
        with pytest.raises(BackendError) as refused:
            await q.offer("x", 60)
    assert str(refused.value).startswith(
        "an offer's first call on this client, reading the server's native long size, failed: ConnectionError: "
        f"Error 111 connecting to 127.0.0.1:{port}.")
    assert refused.value.maybe_applied is False
