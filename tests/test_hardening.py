"""Regression tests of the hardening issue: stalls longer than every timeout, lost replies, forced
shutdowns, many queues on one client, restricted users, misuse. Each fails on the code before it."""

from __future__ import annotations

import asyncio
import gc
import logging
import weakref
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.backoff import ConstantBackoff

import aiodelayq._redis.retry as retry_module
from aiodelayq import (
    AccessDeniedError,
    CallTimeoutError,
    ConfigurationError,
    DelayedQueue,
    NotReplicatedError,
    QueueClosedError,
    QueueCounts,
    QueueKeys,
    Retry,
    WrongEventLoopError,
    delay_to_ms,
)
from aiodelayq._scripts import OFFER, POP, RECEIVE, SETTLE
from aiodelayq.testing import ThrowawayServer, server_version
from tests.faults import stall_server
from tests.helpers import until

# -- 1. a stall longer than every timeout ------------------------------------------------------------


async def test_a_stall_longer_than_every_timeout_neither_loses_nor_invents_items(
        debug_server: ThrowawayServer, make_client: Any, make_queue: Any) -> None:
    client, admin = make_client(debug_server), make_client(debug_server)
    q: DelayedQueue[str] = make_queue("stall", redis=client, codec="str", call_timeout_s=0.5, safety_poll_s=0.2)
    async with q:
        got: list[str] = []

        async def consume() -> None:
            while len(got) < 10:
                got.extend(await q.take_many(10))

        consumer = asyncio.create_task(consume())
        await asyncio.sleep(0.3)  # the consumer waits; transfers and pops run every ~0.2 s
        stall = stall_server(debug_server.url, 2.0)
        await asyncio.sleep(1.0)  # calls time out during the stall and drop their connections
        stall.result(10)
        await admin.rpush("stall", *"abcde")  # straight to the destination, as in the report
        await until(lambda: len(got) >= 5, timeout_s=10)
        await q.offer_many([(x, 0) for x in "fghij"])
        await asyncio.wait_for(consumer, 10)
        assert got == list("abcdefghij")
        assert await q.poll(0.3) is None


# -- 2. forced shutdown -----------------------------------------------------------------------------

FORCED_SHUTDOWN = r"""
import asyncio, sys, time
from redis.asyncio import Redis
from aiodelayq import DelayedQueue

url, name, cancel_after, during_close = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4] == "1"

async def main():
    client = Redis.from_url(url)
    q = DelayedQueue(client, name, codec="str")
    await q.offer_many([(str(i), (i % 100) / 100) for i in range(3000)])

    async def consume():
        async with q:
            async for item in q:
                print("got", item, flush=True)

    task = asyncio.create_task(consume())
    await asyncio.sleep(cancel_after)
    if during_close:
        asyncio.create_task(q.aclose())  # loop shutdown will cancel it midway
        await asyncio.sleep(0)
    task.cancel()
    print("cancelled", time.monotonic(), flush=True)
    # Return from asyncio.run without closing anything: what a second Ctrl-C under uvicorn does.

asyncio.run(main())
print("returned", time.monotonic(), flush=True)
"""


@pytest.mark.parametrize(("cancel_after", "during_close"), [(0.3, False), (0.05, False), (0.7, False), (0.3, True)])
async def test_a_forced_shutdown_loses_no_popped_item_and_returns_promptly(
        redis_server: Any, qname: str, client: Redis, make_queue: Any, spawn_consumer: Any, cancel_after: float,
        during_close: bool) -> None:
    child = spawn_consumer(FORCED_SHUTDOWN, args=[redis_server.url, qname, str(cancel_after),
                                                  "1" if during_close else "0"])
    assert await child.await_exit(30) == 0, child.stderr
    lines = child.lines
    cancelled = next(float(line.split()[1]) for line in lines if line.startswith("cancelled"))
    returned = next(float(line.split()[1]) for line in lines if line.startswith("returned"))
    # The library may flush for up to 0.5 s; a hang would wait for the 5 s call timeout or more.
    assert returned - cancelled < 2.5
    assert "Task was destroyed" not in child.stderr
    assert "Unclosed" not in child.stderr
    consumed = [line.split()[1] for line in lines if line.startswith("got ")]
    assert len(consumed) == len(set(consumed))
    keys = make_queue().keys  # deleted after the test
    left = [x.decode() for x in await client.lrange(qname, 0, -1)]
    pending = await client.zcard(keys.timeout_set)
    in_handoff = 0
    for blob in (await client.hgetall(keys.handoff)).values():
        in_handoff += _count_packed(blob)
    assert not set(consumed) & set(left)
    assert len(consumed) + len(left) + pending + in_handoff == 3000


FORCED_SHUTDOWN_RELIABLE = r"""
import asyncio, sys
from redis.asyncio import Redis
from aiodelayq import DelayedQueue

url, name, cancel_after = sys.argv[1], sys.argv[2], float(sys.argv[3])

async def main():
    q = DelayedQueue(Redis.from_url(url), name, codec="str")
    await q.offer_many([(str(i), (i % 100) / 100) for i in range(2000)])

    async def consume():
        async with q:
            async for msg in q.messages(30):
                print("got", msg.value, flush=True)
                await msg.ack()

    task = asyncio.create_task(consume())
    await asyncio.sleep(cancel_after)
    task.cancel()

asyncio.run(main())
print("returned", flush=True)
"""


@pytest.mark.parametrize("cancel_after", [0.05, 0.3, 0.6])
async def test_a_forced_shutdown_counts_no_delivery_nobody_saw(redis_server: Any, qname: str, client: Redis,
                                                               make_queue: Any, spawn_consumer: Any,
                                                               cancel_after: float) -> None:
    child = spawn_consumer(FORCED_SHUTDOWN_RELIABLE, args=[redis_server.url, qname, str(cancel_after)])
    assert await child.await_exit(30) == 0, child.stderr
    assert "Task was destroyed" not in child.stderr
    seen = {line.split()[1] for line in child.lines if line.startswith("got ")}
    keys = make_queue().keys  # deleted after the test
    in_flight = [m[32:].decode() for m in await client.zrange(keys.in_flight, 0, -1)]
    assert set(in_flight) <= seen  # in flight only what a consumer saw (at most the one not yet acked)
    left = await client.llen(qname) + await client.zcard(keys.timeout_set)
    assert len(seen) + left == 2000


def _count_packed(blob: bytes) -> int:
    n, pos = 0, 0
    while pos + 4 <= len(blob):
        pos += 4 + int.from_bytes(blob[pos:pos + 4], "big")
        n += 1
    return n


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


# -- 3. many consumed queues on one client -------------------------------------------------------------


async def test_two_thousand_consumed_queues_keep_the_client_to_a_few_connections(
        qname: str, client: Redis, make_client: Any, make_queue: Any) -> None:
    consumer = make_client(max_connections=100, client_name="adq-many")
    queues: list[DelayedQueue[int]] = [make_queue(f"{qname}:{i}", redis=consumer) for i in range(2000)]
    for start in range(0, 2000, 500):
        await asyncio.gather(*(q.open() for q in queues[start:start + 500]))
    takers = [asyncio.create_task(q.take()) for q in queues]
    try:
        await asyncio.sleep(0.5)
        producer = make_queue(f"{qname}:7", redis=consumer)
        await producer.offer(7, 0)
        assert await asyncio.wait_for(takers[7], 10) == 7
        clients = [c for c in await client.client_list() if c.get("name") == "adq-many"]
        assert len(clients) <= 12, len(clients)
        assert sum(q.stats.transfer_errors for q in queues) == 0
    finally:
        for t in takers:  # before the queues close (after the test): no taker is left failing unseen
            t.cancel()


# -- 4. replies lost after the command was applied ------------------------------------------------------


async def test_a_resent_offer_whose_reply_was_lost_is_delivered_once(own_server: Any, make_proxy: Any,
                                                                     make_client: Any, make_queue: Any) -> None:
    proxy = make_proxy(own_server())
    q: DelayedQueue[int] = make_queue("lost", redis=make_client(proxy), call_timeout_s=5.0)
    async with q:
        for i in range(10):
            proxy.kill_after_send(OFFER.sha.encode())
            await q.offer(i, 0)  # the first send is applied, its reply lost, then resent
            assert await proxy.wait_killed_async(i + 1, 5)
        got = [await asyncio.wait_for(q.take(), 5) for _ in range(10)]
        assert sorted(got) == list(range(10))
        assert await q.poll(0.5) is None


async def test_a_resent_receive_and_ack_are_not_counted_twice(own_server: Any, make_proxy: Any, make_client: Any,
                                                              make_queue: Any) -> None:
    proxy = make_proxy(own_server())
    client = make_client(proxy)
    q: DelayedQueue[str] = make_queue("lost-r", redis=client, codec="str", max_deliveries=1)
    async with q:
        for expected, x in enumerate("abc"):
            await q.offer(x, 0)  # one at a time: each receive makes its own call (no prefetched message)
            proxy.kill_after_send(RECEIVE.sha.encode())
            msg = await q.receive(30, timeout=5)
            assert msg is not None
            assert (msg.value, msg.delivery_count) == (x, 1)
            proxy.kill_after_send(SETTLE.sha.encode())
            assert await msg.ack(confirm=True) is True  # applied, reply lost, resent: still the truth
            assert proxy.killed == 2 * (expected + 1)
        assert await q.receive(0.1, timeout=0.3) is None
        assert await q.dead_letters() == []
        assert await client.zcard(q.keys.in_flight) == 0


async def test_a_pop_whose_resend_never_left_still_returns_its_items_at_once(
        own_server: Any, make_proxy: Any, make_client: Any, make_queue: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    # First POP applied and its reply lost; the resend then fails before reaching the server. The
    # items must come from the resend that finally gets through, not wait out the 20 s lease.
    monkeypatch.setattr(retry_module, "RETRY_BACKOFF", ConstantBackoff(0.3))
    server = own_server()
    proxy = make_proxy(server)
    client, admin = make_client(proxy), make_client(server)
    q: DelayedQueue[str] = make_queue("r3", redis=client, codec="str", call_timeout_s=1.0)
    async with q:
        await q.offer("warm", 0)
        assert await asyncio.wait_for(q.take(), 5) == "warm"  # POP and FINISH loaded
        proxy.kill_after_send(POP.sha.encode())
        await admin.rpush("r3", "x")
        loop = asyncio.get_running_loop()
        start = loop.time()
        taker = asyncio.ensure_future(q.take())
        assert await proxy.wait_killed_async(1, 5)
        proxy.pause()
        await asyncio.sleep(2.0)  # resends time out unsent
        proxy.resume()
        assert await asyncio.wait_for(taker, 10) == "x"
        assert loop.time() - start < 10
        assert q.stats.recovered == 0


async def test_a_resent_receive_keeps_the_true_deadline(own_server: Any, make_proxy: Any, make_client: Any,
                                                        make_queue: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(retry_module, "RETRY_BACKOFF", ConstantBackoff(0.6))
    server = own_server()
    proxy = make_proxy(server)
    client, admin, direct = make_client(proxy), make_client(server), make_client(server)
    q: DelayedQueue[str] = make_queue("r2", redis=client, codec="str")
    other: DelayedQueue[str] = make_queue("r2", redis=direct, codec="str")
    async with q, other:
        await q.offer("warm", 0)
        warm = await q.receive(1.0, timeout=5)
        assert warm is not None
        assert await warm.ack(confirm=True)  # RECEIVE and SETTLE loaded
        await q.offer("m", 0)
        await asyncio.sleep(0.3)
        proxy.kill_after_send(RECEIVE.sha.encode())
        # Resent 0.6 s after the loss, well inside the 2 s timeout the lost call started.
        msg = await q.receive(visibility_timeout=2.0, timeout=5)
        assert msg is not None
        [(_, score)] = await admin.zrange(q.keys.in_flight, 0, -1, withscores=True)
        assert msg.deadline_ms == int(score)
        again = await other.receive(visibility_timeout=30, timeout=5)  # after the true deadline
        assert again is not None
        assert again.delivery_count == 2
        monkeypatch.setattr(retry_module, "RETRY_BACKOFF", ConstantBackoff(0.01))
        proxy.kill_after_send(SETTLE.sha.encode())
        assert await msg.ack() is False  # superseded (and too late to write behind): never claims a settle
        assert await admin.zcard(q.keys.in_flight) == 1


# -- 6, 7, 9, 13: lifecycle ------------------------------------------------------------------------------


async def test_clients_handed_to_queues_can_be_garbage_collected(redis_server: Any, qname: str,
                                                                  drop_keys: Any) -> None:
    for i in range(3):
        drop_keys(*QueueKeys.for_name(f"{qname}:{i}").all)
    refs = []
    for i in range(50):
        c = Redis.from_url(redis_server.url)  # not make_client: the factory would keep it alive
        q = DelayedQueue(c, f"{qname}:{i % 3}")
        await q.offer(i, 3600)
        if i % 5 == 0:
            async with q:
                pass
        await c.aclose()
        refs.append(weakref.ref(c))
        del c, q
    gc.collect()
    alive = sum(1 for r in refs if r() is not None)
    assert alive == 0


async def test_cancelling_one_opener_does_not_cancel_the_others(make_queue: Any) -> None:
    q = make_queue()
    first, second = asyncio.create_task(q.open()), asyncio.create_task(q.open())
    await asyncio.sleep(0)
    first.cancel()
    assert await asyncio.wait_for(second, 10) is q
    assert q.is_open
    with pytest.raises(asyncio.CancelledError):
        await first


async def test_aclose_stays_within_its_bound_while_another_queue_opens_during_a_stall(
        debug_server: ThrowawayServer, make_client: Any, make_queue: Any) -> None:
    client = make_client(debug_server)
    a = make_queue("a", redis=client, close_timeout_s=1.0, call_timeout_s=5.0)
    b = make_queue("b", redis=client, open_timeout_s=10.0)
    await a.open()
    taker = asyncio.create_task(a.take())
    stall = stall_server(debug_server.url, 3.0)
    opening = asyncio.create_task(b.open())
    await asyncio.sleep(0.2)
    loop = asyncio.get_running_loop()
    start = loop.time()
    await a.aclose()
    # The bound is close_timeout_s (1 s); 0.25 s covers a busy loop's lag. Waiting for the stall
    # (3 s) would take 2.8 s.
    assert loop.time() - start <= 1.0 + 0.25
    with pytest.raises(QueueClosedError):
        await taker
    stall.result(10)
    await asyncio.wait_for(opening, 15)


async def test_a_queue_used_from_another_event_loop_says_so(make_client: Any, make_queue: Any) -> None:
    q: DelayedQueue[int] = make_queue(redis=make_client())  # a client of its own: another loop will touch it
    await q.offer(1, 3600)

    def other_loop() -> BaseException | None:
        async def use() -> None:
            await q.offer(2, 3600)

        try:
            asyncio.run(use())
        except BaseException as exc:
            return exc
        return None

    error = await asyncio.to_thread(other_loop)
    assert isinstance(error, WrongEventLoopError)


# -- 8. big offers do not fail small ones --------------------------------------------------------------


async def test_one_big_offer_does_not_fail_small_ones(own_server: Any, make_client: Any, make_queue: Any) -> None:
    client = make_client(own_server(**{"proto-max-bulk-len": "1mb"}))
    q: DelayedQueue[str] = make_queue("big", redis=client, codec="str")
    big = "x" * 100_000
    results = await asyncio.gather(*[q.offer(big, 60) for _ in range(11)],
                                   *[q.offer("tiny", 60) for _ in range(11)])
    assert len(results) == 22
    await q.offer_many([(big, 60)] * 12)
    assert await q.size() == 34


# -- 11. nack of the last allowed delivery ----------------------------------------------------------


async def test_nack_of_the_last_allowed_delivery_dead_letters_at_once(client: Redis, make_queue: Any) -> None:
    q = make_queue(codec="str", max_deliveries=2)
    await q.offer("poison", 0)
    async with q:
        for count in (1, 2):
            msg = await q.receive(30, timeout=5)
            assert msg is not None
            assert msg.delivery_count == count
            assert await msg.nack() is True
        [letter] = await q.dead_letters()
        assert (letter.raw, letter.reason, letter.delivery_count) == (b"poison", "max_deliveries", 2)
        assert await client.zcard(q.keys.in_flight) == 0
        assert q.stats.exhausted == 1


# -- 12. restricted users -----------------------------------------------------------------------------

# The minimal ACL of docs/deployments.md for a queue named NAME (keep the two in step).
ACL_RULES = ["on", ">secret", "resetkeys", "resetchannels", "-@all",
             "~NAME", "~redisson_delay_queue_timeout:{NAME}", "~redisson_delay_queue:{NAME}",
             "~redisson_delay_queue_channel:{NAME}", "~aiodelayq_*:{NAME}", "&redisson_delay_queue_channel:{NAME}",
             "+evalsha", "+script|load", "+time", "+zadd", "+zrange", "+zrangebyscore", "+zrem", "+zscore",
             "+zmscore", "+zcard", "+zcount", "+zrank", "+rpush", "+lpush", "+lpop", "+lrem", "+llen", "+lrange",
             "+hget", "+hset", "+hdel", "+hlen", "+hmget", "+hrandfield", "+ltrim", "+publish", "+subscribe",
             "+unsubscribe", "+ping", "+unlink", "+wait"]
# ... and, on servers that have WAITAOF (Redis and Valkey >= 7.2; ACL SETUSER refuses unknown commands):
ACL_RULES_WAITAOF = ["+waitaof"]


def acl_rules(name: str, version: tuple[int, ...] = (0,)) -> list[str]:
    """The minimal ACL of docs/deployments.md for queue ``name`` on a server of ``version``."""
    rules = ACL_RULES + (ACL_RULES_WAITAOF if version >= (7, 2) else [])
    return [rule.replace("NAME", name) for rule in rules]


async def test_producer_and_consumer_work_as_the_documented_minimal_acl_user(acl_client: Any, make_queue: Any,
                                                                             redis_server: Any) -> None:
    version = tuple(int(x) for x in server_version(redis_server.kind.binary).split(".")[:2])
    client = await acl_client("queue-user", "secret", acl_rules("orders", version))
    q: DelayedQueue[int] = make_queue("orders", redis=client, max_deliveries=3)
    await q.offer_many([(i, 0.05) for i in range(20)])
    async with q:
        got = [await asyncio.wait_for(q.take(), 5) for _ in range(10)]
        msgs: list[Any] = []
        while len(got) + len(msgs) < 20:  # items the takes prefetched come back within a round trip
            batch = await q.receive_many(10, 30, timeout=5)
            assert batch, "receive found nothing within 5 s"
            msgs += batch
        for m in msgs[:-1]:
            assert await m.ack()
        assert await msgs[-1].ack(confirm=True)  # waits for its SETTLE (and those before it): refused if denied
        assert sorted(got + [m.value for m in msgs]) == list(range(20))
        assert await q.counts() == QueueCounts(0, 0, 0, 0, None)
        assert await q.size() == 0
        assert await q.read_all() == []
        await q.offer_many([(100, 60), (101, 60)])
        assert await q.contains(100)
        assert await q.remove(100)
        assert await q.remove_all([101])
        assert await q.ready_size() == 0
        assert await q.dead_letters() == []
        # Keys, leases and dead letters (issue 11) as the same user.
        assert (await q.offer(200, 60, key="k200")).added
        assert not (await q.offer(201, 60, key="k200")).added
        assert (await q.offer(202, 60, key="k200", replace=True)).replaced
        assert (await q.get("k200")).value == 202  # type: ignore[union-attr]
        assert await q.reschedule("k200", 0.05) is not None
        await q.offer_many([(300, 60), (301, 60)], keys=["k300", None])
        assert await q.cancel("k300")
        msg = await q.receive(30, timeout=5)
        assert msg is not None
        assert msg.value == 202
        assert await msg.extend(30)
        async with msg.lease(every=0.05):
            await asyncio.sleep(0.12)
        assert await msg.nack(dead_letter=True)
        [letter] = await q.dead_letters()
        assert (letter.value, letter.reason) == (202, "nacked")
        assert await q.requeue_dead_letters(delay=60) == 1
        await client.rpush(q.keys.dead_letter, b"1")
        assert await q.purge_dead_letters() == 1
        # peek as the same user: 301 (unkeyed) and 202, requeued from the dead letters without its key
        assert sorted((p.value, p.key) for p in await q.peek(5)) == [(202, None), (301, None)]
        # The worker (issue 13) as the same user: ack, retry, dead letter.
        await q.purge_dead_letters()
        seen: list[int] = []

        async def handler(item: int) -> None:
            seen.append(item)
            if item == 401 and seen.count(401) == 1:
                raise Retry(0.05)

        await q.offer_many([(400, 0), (401, 0)])
        worker = q.worker(handler, concurrency=2)
        running = asyncio.create_task(worker.run())
        await until(lambda: sorted(seen) == [400, 401, 401], timeout_s=10)
        worker.stop()
        await running
        await q.clear()
        loop = asyncio.get_running_loop()
        taker = asyncio.create_task(q.take())
        await asyncio.sleep(0.1)
        start = loop.time()
    # A few round trips; a close that waited for the take would run into close_timeout_s (5 s).
    assert loop.time() - start <= 1.0
    with pytest.raises(QueueClosedError):
        await taker
    # Durable writes (issue 12): WAIT is allowed; this server has no replica, so none confirms.
    durable: DelayedQueue[int] = make_queue("orders", redis=client, min_replicas=1, replication_timeout_s=0.05)
    with pytest.raises(NotReplicatedError) as caught:
        await durable.offer(1, 60)
    assert caught.value.replicas == 0
    if version >= (7, 2):  # WAITAOF is allowed too: refused only because this server has no AOF
        aof: DelayedQueue[int] = make_queue("orders", redis=client, wait_aof=True)
        with pytest.raises(ConfigurationError, match="appendonly"):
            await aof.offer(2, 60)
    await durable.clear()


async def test_missing_permissions_are_clear_permanent_errors(acl_client: Any, make_queue: Any) -> None:
    client = await acl_client("reader", "pw", ["on", ">pw", "~*", "&*", "+@read", "+ping", "+hello", "+subscribe",
                                               "+evalsha", "+script|load"])
    q: DelayedQueue[int] = make_queue("orders", redis=client, open_timeout_s=30)
    loop = asyncio.get_running_loop()
    start = loop.time()
    with pytest.raises(AccessDeniedError):
        await q.offer(1, 0)
    with pytest.raises(AccessDeniedError):
        await q.open()
    assert loop.time() - start < 5  # not "could not subscribe within 30 s", not retried forever


async def test_the_first_take_without_permission_to_pop_raises_it(acl_client: Any, make_queue: Any) -> None:
    client = await acl_client("nopop", "secret", [r for r in acl_rules("orders") if r != "+lpop"])
    async with make_queue("orders", redis=client) as q:
        await q.offer(1, 0)
        with pytest.raises(AccessDeniedError):
            await asyncio.wait_for(q.take(), 5)
        with pytest.raises(AccessDeniedError):
            await asyncio.wait_for(q.receive(30), 5)


# -- 14. small ones ------------------------------------------------------------------------------------


def test_a_tiny_positive_delay_rounds_up_to_one_ms() -> None:
    assert delay_to_ms(1e-9) == 1
    assert delay_to_ms(0.1) == 100
    assert delay_to_ms(0.0011) == 2
    assert delay_to_ms(0) == 0


# -- 15. evicting servers --------------------------------------------------------------------------------


async def test_an_evicting_server_is_named_as_a_risk(own_server: Any, make_client: Any, make_queue: Any,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    client = make_client(own_server(**{"maxmemory": "100mb", "maxmemory-policy": "allkeys-lru"}))
    with caplog.at_level(logging.WARNING, logger="aiodelayq"):
        await make_queue("evict", redis=client).offer(1, 60)
        await until(lambda: "allkeys-lru" in caplog.text, timeout_s=5)


# -- 16. a producer that cannot hang --------------------------------------------------------------------


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
    assert loop.time() - start < 2.0  # call_timeout_s (0.5 s) plus lag; well before the 4 s stall ends
    assert caught.value.maybe_applied
    stall.result(10)
    assert await q.offer(2, 60) > 0
