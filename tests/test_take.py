"""take(), take_many(), poll() and ``async for``: items one at a time from a prefetch, in list order,
without holding items nobody waits for; when the take pump pops and what wakes a waiting taker;
cancelled and timed-out takes that lose nothing; several consumers that each get an item once; and
POP replies lost or abandoned."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import random
import textwrap
from collections import Counter
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.backoff import ConstantBackoff

import aiodelayq._redis.backoff as backoff_module
from aiodelayq import ConfigurationError, DelayedQueue, InvalidDelayError
from aiodelayq._consuming.handoff import payloads
from aiodelayq._consuming.prefetch import MAX_PREFETCH
from aiodelayq._consuming.take_phases import DRAINED_FOR_S
from aiodelayq._scripts import QueueScripts
from tests.helpers import (
    dead_letters_are,
    first_line,
    handoff_payloads,
    llen_is,
    open_with_ready,
    takers_waiting,
    until,
)

# -- take, poll, take_many, async for -------------------------------------------------------------


async def test_poll(make_queue: Any) -> None:
    q = make_queue()
    async with q:
        assert await q.poll() is None
        assert await q.poll(0) is None
        assert await q.poll(0.05) is None
        await q.offer("x", 0)
        assert await q.poll(5) == "x"
        await q.offer("y", 0)
        await until(q.ready_size)
        assert await q.poll() == "y"
        with pytest.raises(InvalidDelayError):
            await q.poll(-1)
        with pytest.raises(InvalidDelayError):
            await q.poll(math.nan)


async def test_async_for_ends_when_closed(make_queue: Any) -> None:
    q = make_queue()
    await q.offer_many([(i, 0) for i in range(5)])
    got: list[int] = []

    async def consume() -> None:
        async for item in q:
            got.append(item)
            if len(got) == 5:
                asyncio.get_running_loop().create_task(q.aclose())

    async with q:
        await asyncio.wait_for(consume(), 5)
    assert sorted(got) == list(range(5))


async def test_async_for_loops_that_break_leave_the_rest_to_the_next_loop_in_order(client: Redis,
                                                                                 make_queue: Any) -> None:
    # Each loop is a new iterator; what the first prefetched and did not hand out stays for the
    # next loop, and take() (neither lost nor doubled).
    async with open_with_ready(client, make_queue(), 300) as q:
        got: list[int] = []
        for stop in (10, 150):
            async for item in q:
                got.append(item)
                if len(got) == stop:
                    break
        got.append(await q.take())
        while len(got) < 300:
            got += await q.take_many(1000, timeout=5)
    assert got == list(range(300))


async def test_take_many_returns_what_is_ready_in_one_round_trip(client: Redis, make_queue: Any) -> None:
    q = make_queue()
    await q.offer_many([(i, 0) for i in range(250)])
    async with q:
        got: list[int] = []
        while len(got) < 250:
            batch = await q.take_many(100, timeout=5)
            assert 1 <= len(batch) <= 100
            got.extend(batch)
        assert sorted(got) == list(range(250))
        assert await q.take_many(10, timeout=0.05) == []
        with pytest.raises(ConfigurationError):
            await q.take_many(0)


async def test_a_pop_of_payloads_json_loads_must_judge_is_decoded_item_by_item(client: Redis,
                                                                                make_queue: Any) -> None:
    # A pop of bare JSON payloads is decoded in one call; one item that is not (headers, text with
    # spaces around, an empty or broken payload) sends the whole pop item by item: the same items in
    # the list's order, the undecodable ones dead-lettered, none dropped or decoded twice.
    q: DelayedQueue[Any] = make_queue()
    await client.rpush(q.keys.destination, b"1", b" 2 ")
    await q.offer("h", 0, headers={"k": "v"})
    async with q:  # the opening transfer moves the headed item behind them
        await client.rpush(q.keys.destination, b"", b"{not json", b"[3]", b'"4" ', b"5")
        await until(lambda: llen_is(client, q, 8), timeout_s=5)
        got: list[Any] = []
        while len(got) < 6:
            got += await q.take_many_with_headers(20, timeout=5)
        assert got == [(1, {}), (2, {}), ("h", {"k": "v"}), ([3], {}), ("4", {}), (5, {})]
        await until(lambda: dead_letters_are(q, 2), timeout_s=5)
        assert q.stats.undecodable == 2
    assert sorted(d.raw for d in await q.dead_letters()) == [b"", b"{not json"]


# -- the prefetch: one item at a time at batch speed, nothing held for nobody ----------------------


async def _take(q: Any, count: int) -> list[int]:
    """``count`` items, one ``take()`` at a time (the prefetch grows meanwhile)."""
    return [await asyncio.wait_for(q.take(), 5) for _ in range(count)]


async def test_one_at_a_time_takes_are_served_from_a_prefetch_in_order(client: Redis, make_queue: Any) -> None:
    n = 3 * MAX_PREFETCH
    async with open_with_ready(client, make_queue(codec="json"), n) as q:
        got = await _take(q, n)
        assert got == list(range(n))  # list order, one by one, none twice
        # One round trip per item would be n pops; the prefetch grows to 100 per pop (it may halve
        # when the machine stalls a take past the hold, so the bound leaves room for that).
        assert q.stats.pops <= n // 4
        assert await client.llen(q.keys.destination) == 0
        # The last pop's hand-off entry is forgotten by the next POP, or by FINISH within a round trip.
        await until(lambda: _handoff_empty(client, q), timeout_s=1)


async def test_prefetched_items_nobody_takes_go_back_within_a_round_trip(client: Redis, make_queue: Any) -> None:
    n = 200
    async with open_with_ready(client, make_queue(codec="json"), n) as q:
        taken = await _take(q, 20)
        pump = q._life.pump()
        # Pops of 1, 2, 4, 8, 16 items served 20 takes: about 11 were prefetched for nobody. Within a
        # round trip (at most 50 ms) every item not taken is back at the head of the list, in order,
        # and the hand-off entries are finished: nothing is held for a caller that does not come.
        await until(lambda: llen_is(client, q, n - len(taken)), timeout_s=1)
        await until(lambda: _handoff_empty(client, q), timeout_s=1)
        assert not pump._buffer
        assert q.stats.returned >= 1
        rest = await client.lrange(q.keys.destination, 0, -1)
        assert [int(x) for x in rest] == list(range(len(taken), n))
        assert taken == list(range(len(taken)))
        # Another consumer gets them.
        assert await asyncio.wait_for(q.take(), 5) == len(taken)


@pytest.mark.parametrize("then", ["stop", "close"])
async def test_what_a_read_ahead_got_goes_back_in_order_when_the_caller_stops(client: Redis, make_queue: Any,
                                                                              then: str) -> None:
    # Full pops of callers that keep up send the next POP before their items are decoded. When the
    # caller stops (or the queue closes) with one out, what it got goes back in front of nothing newer:
    # the list holds the rest in order, the hand-off nothing, and nothing was taken twice.
    n = 1000
    q = make_queue(codec="json")
    async with open_with_ready(client, q, n):
        taken: list[int] = []
        for _ in range(3):  # full pops: most often a read-ahead is out after each, or read into the buffer
            taken += await asyncio.wait_for(q.take_many(100), 5)
        if then == "stop":
            await until(lambda: llen_is(client, q, n - len(taken)), timeout_s=5)
            await until(lambda: _handoff_holds_nothing(client, q), timeout_s=5)
    if then == "close":
        await until(lambda: llen_is(client, q, n - len(taken)), timeout_s=5)
    assert taken == list(range(len(taken)))
    assert [int(x) for x in await client.lrange(q.keys.destination, 0, -1)] == list(range(len(taken), n))
    assert await _handoff_holds_nothing(client, q)


async def _llen_at_least(client: Redis, q: Any, n: int) -> bool:
    return int(await client.llen(q.keys.destination)) >= n


async def _handoff_holds_nothing(client: Redis, q: Any) -> bool:
    """No item in the hand-off: a read-ahead dropped before it landed leaves an empty entry (a
    tombstone, until its lease ends) for a POP still on its way."""
    return all(v == b"" for v in await client.hvals(q.keys.handoff))


async def _until_buffered_with_no_read_ahead(q: Any, pump: Any) -> None:
    """Take until a pop left items in the buffer, with no read-ahead out and no transfer request
    waiting (the transfer task's own: it asks the pump after every offer)."""
    for _ in range(400):
        await asyncio.wait_for(q.take(), 5)
        if pump._buffer and pump._ahead.ahead is None and pump._transfer_ask is None:
            return
    raise AssertionError("no pop left items in the buffer with no read-ahead out")


async def _handoff_empty(client: Redis, q: Any) -> bool:
    return int(await client.hlen(q.keys.handoff)) == 0


async def test_close_with_a_full_prefetch_buffer_loses_nothing(client: Redis, make_queue: Any) -> None:
    n = 300
    async with open_with_ready(client, make_queue(codec="json", safety_poll_s=300), n) as q:
        taken = await _take(q, 40)
    # Closed at once, items perhaps still prefetched: all of them are back in the list, none twice,
    # and none left in the hand-off (a read-ahead dropped before its POP went out leaves a tombstone).
    rest = [int(x) for x in await client.lrange(q.keys.destination, 0, -1)]
    assert sorted(taken + rest) == list(range(n))
    assert await _handoff_holds_nothing(client, q)


async def test_concurrent_takers_keep_their_order_with_a_prefetch(client: Redis, make_queue: Any) -> None:
    n = 100
    async with open_with_ready(client, make_queue(codec="json"), n) as q:
        first = await _take(q, 10)
        # Five takers that start waiting in order get items in that order.
        results = await asyncio.gather(*(asyncio.wait_for(q.take(), 5) for _ in range(5)))
        assert results == sorted(results)
        assert first + results == list(range(15))


# -- when the pump pops, and what wakes a waiting taker ----------------------------------------------


async def test_a_waiting_taker_gets_due_items_in_the_pop_that_transfers_them(client: Redis, make_queue: Any) -> None:
    q = make_queue(codec="json", safety_poll_s=300)
    async with q:
        for i in range(5):
            taker = asyncio.ensure_future(q.take())
            await q.offer(i, 0.05)
            assert await asyncio.wait_for(taker, 5) == i
        # The transfer task's timer found a waiting taker each time: its POP moved the item and popped it.
        assert q.stats.pops_that_transferred >= 4
        assert q.stats.moved == 5
        await until(lambda: _handoff_empty(client, q), timeout_s=1)


async def test_a_stream_of_due_items_makes_no_empty_pop_after_each_transfer(make_queue: Any) -> None:
    q = make_queue(codec="json", safety_poll_s=300)
    n = 40
    async with q:
        await q.offer_many([(i, 0.2 + 0.01 * i) for i in range(n)])  # one due every 10 ms
        got = []
        async for item in q:
            got.append(item)
            if len(got) == n:
                break
        assert got == list(range(n))
        # Each due time: the timer's POP transfers and pops the item; the caller comes back for
        # the next one right after the list was found empty, and waits for the next transfer
        # instead of popping, which would be one empty POP per item. A loop that lags past the
        # drained window may add an empty POP now and then: a quarter is allowed.
        assert q.stats.empty_pops <= n // 4, q.stats


async def test_items_pushed_straight_into_the_list_reach_a_waiter_that_did_not_pop(
        client: Redis, make_queue: Any) -> None:
    q = make_queue(codec="json", safety_poll_s=300)
    async with q:
        pump = q._life.pump()
        assert await q.poll() is None  # a pop that found the list empty
        taker = asyncio.ensure_future(q.take())
        await asyncio.sleep(0)
        assert pump._outlook.recheck is not None  # it waits without popping ...
        await client.rpush(q.keys.destination, b"7")  # ... while other code pushes straight into the list
        loop = asyncio.get_running_loop()
        started = loop.time()
        assert await asyncio.wait_for(taker, 2) == 7  # not at the next transfer (300 s away)
        assert loop.time() - started < DRAINED_FOR_S + 1.0


async def test_a_transfer_request_waits_for_the_caller_taking_from_the_buffer(client: Redis, make_queue: Any) -> None:
    # Full pops send a read-ahead, and a request meets "no" while one is out: each part takes until
    # the last, short pop of a batch left items in the buffer with none out.
    async with open_with_ready(client, make_queue(codec="json", safety_poll_s=300), 300) as q:
        pump = q._life.pump()
        await _until_buffered_with_no_read_ahead(q, pump)
        ask = pump.ask_transfer(100)
        assert ask is not None  # nobody waits, but the caller is still taking from the buffer
        # More items for the caller that then waits; offered once this task first waits, below.
        offering = asyncio.ensure_future(q.offer_many([(i, 0) for i in range(300, 310)]))
        while pump._buffer:  # without a yield, as `async for` does
            await q.take()
        assert await q.poll(10.0) is not None  # now it waits: its POP transfers first
        await offering
        sent, received, reply = await asyncio.wait_for(ask, 5)
        assert sent <= received
        assert reply is not None
        assert q.stats.pops_that_transferred >= 1  # the transfer task's own request may ride on a later POP

        await q.offer_many([(i, 0) for i in range(400, 700)])
        await until(lambda: _llen_at_least(client, q, 300), timeout_s=5)
        await _until_buffered_with_no_read_ahead(q, pump)
        ask = pump.ask_transfer(100)
        assert ask is not None
        # Nobody comes back: the buffer goes back within a round trip, and the request with it
        # (the transfer task then transfers itself).
        assert await asyncio.wait_for(ask, 2) is None
        assert not pump._buffer


# -- cancelled and timed-out takes lose nothing -----------------------------------------------------


async def _drain(q: Any, expected: int, got: list[int]) -> None:
    while len(got) < expected:
        item = await q.poll(2.0)
        assert item is not None, f"lost items: have {len(got)} of {expected}"
        got.append(item)


async def test_many_tiny_wait_for_timeouts_lose_nothing(client: Redis, make_queue: Any) -> None:
    n = 400
    q = make_queue(safety_poll_s=300)
    async with q:
        await q.offer_many([(i, random.uniform(0, 0.5)) for i in range(n)])
        got: list[int] = []
        rng = random.Random(7)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 15
        timeouts = 0
        while len(got) < n and loop.time() < deadline:
            try:
                got.append(await asyncio.wait_for(q.take(), rng.choice([0, 0.0001, 0.0005, 0.001, 0.003])))
            except asyncio.TimeoutError:
                timeouts += 1
        await _drain(q, n, got)
        assert timeouts > 100  # the race was really exercised
        assert sorted(got) == list(range(n))  # every item exactly once
        assert await q.poll(0.2) is None
        assert await q.ready_size() == 0


async def test_cancelled_tasks_and_nowait_polls_lose_nothing(client: Redis, make_queue: Any) -> None:
    n = 300
    q = make_queue(safety_poll_s=300)
    async with q:
        await q.offer_many([(i, 0) for i in range(n)])
        got: list[int] = []
        rng = random.Random(11)
        for _ in range(600):
            task = asyncio.create_task(q.take() if rng.random() < 0.5 else q.poll())
            for _ in range(rng.randint(0, 3)):
                await asyncio.sleep(0)
            task.cancel()
            try:
                item = await task
            except asyncio.CancelledError:
                continue
            if item is not None:
                got.append(item)
        await _drain(q, n, got)
        assert sorted(got) == list(range(n))


async def test_close_with_waiting_takes_loses_nothing(redis_server: Any, make_queue: Any, qname: str) -> None:
    n = 200
    q = make_queue()
    await q.offer_many([(i, random.uniform(0, 0.3)) for i in range(n)])
    got: list[int] = []

    async def consumer() -> None:
        async for item in q:
            got.append(item)

    await q.open()
    consumers = [asyncio.create_task(consumer()) for _ in range(8)]
    await until(lambda: len(got) >= n // 2, timeout_s=10, interval_s=0.002)
    await q.aclose()
    await asyncio.gather(*consumers)
    async with make_queue() as rest:
        await _drain(rest, n, got)
    assert sorted(got) == list(range(n))


async def test_take_many_under_tiny_timeouts_loses_nothing(client: Redis, make_queue: Any) -> None:
    n = 600
    q = make_queue(safety_poll_s=300)
    async with q:
        await q.offer_many([(i, random.uniform(0, 0.3)) for i in range(n)])
        got: list[int] = []
        rng = random.Random(5)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 15
        while len(got) < n and loop.time() < deadline:
            with contextlib.suppress(asyncio.TimeoutError):
                got.extend(await asyncio.wait_for(q.take_many(rng.randint(1, 9)), rng.choice([0, 0.0003, 0.002])))
        await _drain(q, n, got)
        assert sorted(got) == list(range(n))


# -- several consumers on one queue: every item exactly once among them ------------------------------

CONSUMER = textwrap.dedent("""
    import asyncio, json, sys
    from redis.asyncio import Redis
    from aiodelayq import DelayedQueue

    async def main(url, name, stop_after_idle):
        client = Redis.from_url(url)
        got = []
        async with DelayedQueue(client, name) as q:
            print("ready", flush=True)
            while True:
                # The first item may come seconds later (the other interpreters still starting
                # on a busy machine); after it, an idle stop_after_idle ends the run.
                item = await q.poll(stop_after_idle if got else 30)
                if item is None:
                    break
                got.append(item)
        await client.aclose()
        print(json.dumps(got), flush=True)

    asyncio.run(main(sys.argv[1], sys.argv[2], float(sys.argv[3])))
""")


async def test_several_clients_in_one_process_exactly_once(make_client: Any, make_queue: Any) -> None:
    n = 1500
    queues = [make_queue(redis=make_client()) for _ in range(3)]
    for q in queues:
        await q.open()
    await queues[0].offer_many([(i, random.uniform(0, 1.0)) for i in range(n)])
    got: list[int] = []

    async def consume(q: DelayedQueue[int]) -> None:
        while (item := await q.poll(1.5)) is not None:
            got.append(item)

    await asyncio.gather(*(consume(q) for q in queues for _ in range(2)))
    counts = Counter(got)
    assert [i for i, c in counts.items() if c > 1] == []
    assert sorted(counts) == list(range(n))
    assert sum(1 for q in queues if q.stats.moved > 0) >= 1


async def test_several_processes_exactly_once(redis_server: Any, make_queue: Any, qname: str,
                                              spawn_consumer: Any) -> None:
    n = 2000
    children = [spawn_consumer(CONSUMER, args=[redis_server.url, qname, "2.0"]) for _ in range(3)]
    for child in children:
        assert (await first_line(child)).strip() == "ready"
    producer = make_queue()
    for start in range(0, n, 500):
        await producer.offer_many([(i, random.uniform(0, 1.0)) for i in range(start, start + 500)])
    await asyncio.gather(*(child.await_exit(60) for child in children))
    per_process = [json.loads(child.lines[-1]) for child in children]
    counts = Counter(i for got in per_process for i in got)
    assert [i for i, c in counts.items() if c > 1] == []
    assert sorted(counts) == list(range(n))
    assert sum(1 for got in per_process if got) >= 2  # the work really was shared


# -- lost and abandoned pops -------------------------------------------------------------------------


async def test_a_pop_that_transferred_and_lost_its_reply_delivers_once(
        own_server: Any, make_proxy: Any, make_client: Any, make_queue: Any) -> None:
    proxy = make_proxy(own_server())
    q = make_queue("lost-tp", redis=make_client(proxy), codec="json", safety_poll_s=300)
    async with q:
        await q.offer("warm", 0)
        assert await asyncio.wait_for(q.take(), 5) == "warm"  # POP loaded
        for i in range(3):
            taker = asyncio.ensure_future(q.take())
            await until(lambda: takers_waiting(q) == 1)  # the taker found nothing and waits
            proxy.kill_after_send(QueueScripts.pop.sha.encode())  # the transferring POP is applied, its reply lost
            await q.offer(i, 0.1)
            assert await asyncio.wait_for(taker, 10) == i  # the resend returns the same item
        assert await q.poll(0.5) is None  # nothing twice
        assert proxy.killed == 3


async def test_a_pop_whose_resend_never_left_still_returns_its_items_at_once(
        own_server: Any, make_proxy: Any, make_client: Any, make_queue: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    # First POP applied and its reply lost; the resend then fails before reaching the server. The
    # items must come from the resend that finally gets through, not wait out the 20 s lease.
    monkeypatch.setattr(backoff_module, "RETRY_BACKOFF", ConstantBackoff(0.3))
    server = own_server()
    proxy = make_proxy(server)
    client, admin = make_client(proxy), make_client(server)
    q: DelayedQueue[str] = make_queue("r3", redis=client, codec="str", call_timeout_s=1.0)
    async with q:
        await q.offer("warm", 0)
        assert await asyncio.wait_for(q.take(), 5) == "warm"  # POP and FINISH loaded
        proxy.kill_after_send(QueueScripts.pop.sha.encode())
        await admin.rpush("r3", "x")
        taker = asyncio.ensure_future(q.take())
        assert await proxy.wait_killed_async(1, 5)
        proxy.stall(2.0)  # two call timeouts without a network: the resends time out unsent
        # Does not hang: a resend after the stall returns the item (in about 2.3 s), long before the
        # hand-off lease would bring it back.
        assert await asyncio.wait_for(taker, 15) == "x"
        assert q.stats.recovered == 0


async def test_a_pop_that_transfers_pops_what_the_list_held_first(client: Redis, make_queue: Any) -> None:
    # A transferring POP hands out what the list holds before the due items it moves (those it pops
    # skip the list when it is empty), and an abandoned hand-off entry's items before both. A
    # backlog drain's top-up (ARGV[5] '1') moves just what it still wants after the list.
    q = make_queue(codec="str")
    k = q.keys
    scripts = QueueScripts(client, k, call_timeout_s=5)
    await q.offer_many([(x, 0) for x in "abcde"])
    reply = await scripts.pop(b"1" * 16, 3, 20_000, 1000)
    assert reply[0][0] == 5
    assert reply[3] == 0  # fast elements, handed out whole
    assert payloads(*reply[3:]) == [b"a", b"b", b"c"]
    assert await client.lrange(k.destination, 0, -1) == [b"d", b"e"]
    assert await client.zcard(k.timeout_set) == 0
    assert handoff_payloads(await client.hget(k.handoff, b"1" * 16)) == [b"a", b"b", b"c"]
    await q.offer_many([("f", 0), ("g", 0)])
    reply = await scripts.pop(b"2" * 16, 3, 20_000, 1000)
    assert reply[0][0] == 2
    assert reply[3] == 3  # from the list: payloads
    assert payloads(*reply[3:]) == [b"d", b"e", b"f"]
    assert await client.hget(k.handoff, b"2" * 16) == b"\x00\x00\x00\x01d\x00\x00\x00\x01e\x00\x00\x00\x01f"
    assert await client.lrange(k.destination, 0, -1) == [b"g"]
    await q.offer_many([(x, 0) for x in "hij"])
    reply = await scripts.pop(b"3" * 16, 3, 20_000, 500, "1")  # a top-up: g, then two moved
    assert reply[0][0] == 2
    assert reply[3] == 1
    assert payloads(*reply[3:]) == [b"g", b"h", b"i"]
    assert handoff_payloads(await client.hget(k.handoff, b"3" * 16)) == [b"g", b"h", b"i"]
    assert (await scripts.pop(b"3" * 16, 3, 20_000, 500, "1"))[3:] == [3, 0, [b"g", b"h", b"i"]]  # a resend
    assert await client.llen(k.destination) == 0
    assert await client.zcard(k.timeout_set) == 1
    assert payloads(*(await scripts.pop(b"4" * 16, 3, 20_000, 500, "1"))[3:]) == [b"j"]  # nothing more due
    # A consumer that popped and died: its entry, with a lease that already ended, goes first.
    await client.hset(k.handoff, b"x" * 16, b"\x00\x00\x00\x01x\x00\x00\x00\x01y")
    await client.zadd(k.handoff_leases, {b"x" * 16: 1})
    await q.offer("h", 0)
    reply = await scripts.pop(b"5" * 16, 2, 20_000, 1000, "1")
    assert reply[0][0] == 1
    assert payloads(*reply[3:]) == [b"x", b"y"]
    assert await client.lrange(k.destination, 0, -1) == [b"h"]


async def test_a_top_up_moves_at_most_the_transfer_batch_per_step_and_reports_its_steps_as_one(
        client: Redis, make_queue: Any) -> None:
    # A top-up moves |ARGV[4]| elements per step, and takes further steps while the call is young: a
    # zset of millions, dearer per element, is held no longer than by a TRANSFER of that batch. Its
    # reply is one transfer's: the counts of all steps, and each moved item's lateness (negative limit).
    q = make_queue(codec="str")
    k = q.keys
    scripts = QueueScripts(client, k, call_timeout_s=5)
    names = [f"i{n:02d}" for n in range(25)]
    await q.offer_many([(x, 0) for x in names])
    reply = await scripts.pop(b"1" * 16, 20, 20_000, -3, "1")  # steps of 3: 7 steps (the call is young)
    moved = reply[0]
    assert (int(moved[0]), int(moved[1])) == (20, 0)
    assert int(moved[7]) == 0  # the list stays empty: every moved item was popped
    assert len(moved[8]) == 20
    assert all(int(late) >= 0 for late in moved[8])
    assert payloads(*reply[3:]) == [x.encode() for x in names[:20]]
    assert await client.zcard(k.timeout_set) == 5
    assert [x.decode() for x in payloads(*(await scripts.pop(b"2" * 16, 20, 20_000, 3, "1"))[3:])] == names[20:]


async def test_a_receiver_is_not_starved_while_takers_drain_a_backlog(client: Redis, make_queue: Any) -> None:
    # While a backlog drains, the takers' POPs move what they pop and the transfer task stands aside;
    # a reliable receiver that waits meanwhile makes it transfer for the list again.
    n = 50_000
    q = make_queue(codec="json", safety_poll_s=300)
    for start in range(0, n, 10_000):
        await q.offer_many([(i, 0) for i in range(start, start + 10_000)])
    taken: list[int] = []
    received: list[int] = []
    async with q:
        async def take() -> None:
            while len(taken) + len(received) < n:
                taken.extend(await q.take_many(1000, timeout=0.5))

        taker = asyncio.ensure_future(take())
        await until(lambda: len(taken) >= 2_000, timeout_s=10)
        while not received and not taker.done():
            for message in await q.receive_many(10, 30.0, timeout=0.5):
                received.append(message.value)
                await message.ack()
        assert received, "the receiver got nothing while the taker drained"
        while len(taken) + len(received) < n:
            for message in await q.receive_many(10, 30.0, timeout=0.5):
                received.append(message.value)
                await message.ack()
        await asyncio.wait_for(taker, 10)
    assert len(taken) + len(received) == n
    assert sorted(taken + received) == list(range(n))


async def test_an_abandoned_handoff_comes_back_within_its_lease(client: Redis, make_queue: Any) -> None:
    q = make_queue(codec="str")
    k = q.keys
    await client.rpush(k.destination, "a", "b")
    # A consumer that popped and died: its entry, with a lease that already ended.
    await client.hset(k.handoff, b"x" * 16, b"\x00\x00\x00\x01c\x00\x00\x00\x01d")
    await client.zadd(k.handoff_leases, {b"x" * 16: 1})
    async with q:
        got = [await asyncio.wait_for(q.take(), 5) for _ in range(4)]
    assert got == ["c", "d", "a", "b"]  # back at the head, in their order
    assert q.stats.recovered == 2
    assert await client.exists(k.handoff, k.handoff_leases) == 0
