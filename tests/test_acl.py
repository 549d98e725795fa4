"""Restricted users: a producer and a consumer work as the minimal ACL user of docs/deployments.md
(keep the two in step), and missing permissions are clear, permanent errors."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import pytest

from aiodelayq import (
    AccessDeniedError,
    ConfigurationError,
    DelayedQueue,
    NotReplicatedError,
    QueueClosedError,
    QueueCounts,
    Retry,
)
from aiodelayq._redis.acl import minimal_acl_rules
from aiodelayq._runtime.client_runtime import runtime_for
from aiodelayq.testing import server_version
from tests.helpers import takers_waiting, until


def acl_rules(name: str, version: tuple[int, ...] = (0,)) -> list[str]:
    """The minimal ACL of docs/deployments.md for queue ``name`` on a server of ``version`` (WAITAOF
    on Redis and Valkey >= 7.2: ACL SETUSER refuses unknown commands)."""
    return ["on", ">secret", *minimal_acl_rules(name, waitaof=version >= (7, 2))]


def test_the_docs_show_the_minimal_acl() -> None:
    text = Path("docs/deployments.md").read_text(encoding="utf-8")
    block = text[text.index("ACL SETUSER orders-app"):]
    block = block[:block.index("```")]
    shown = block.replace("ACL SETUSER orders-app on >password", "").split()
    assert shown == minimal_acl_rules("orders")


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
        # The controls as the same user: a paused receive asks and is held, then gets its message.
        await q.pause()
        assert await q.is_paused()
        await q.set_rate_limit(100, burst=2)
        await q.offer(99, 0)
        receiving = asyncio.create_task(q.receive(30, timeout=5))
        await asyncio.sleep(0.2)
        await q.resume()
        held = await receiving
        assert held is not None
        assert held.value == 99
        assert await held.ack(confirm=True)
        await q.set_rate_limit(None)
        assert await q.counts() == QueueCounts(0, 0, 0, 0, None)
        # The concurrency limit: RECEIVE and SETTLE count what is held, a nack with a delay enters the
        # nacked zset, an ack that makes room publishes.
        await q.set_concurrency_limit(1)
        await q.offer_many([(97, 0), (98, 0)])
        first = await q.receive(30, timeout=5)
        assert first is not None
        assert await first.nack(0.3)  # waits out its delay, not held: room for the other
        second = await q.receive(30, timeout=5)
        assert second is not None
        assert await second.ack(confirm=True)
        again = await q.receive(30, timeout=5)  # the nacked one, back after its delay
        assert again is not None
        assert (again.value, again.delivery_count) == (first.value, 2)
        assert await again.ack(confirm=True)
        await q.set_concurrency_limit(None)
        assert await q.counts() == QueueCounts(0, 0, 0, 0, None)
        # Groups: the grouped zset, a group's list, the ready list and counts; a raised limit admits more.
        assert (await q.offer(60, 3600, key="k60", group="g")).added
        assert (await q.get("k60")).group == "g"  # type: ignore[union-attr]
        assert await q.cancel("k60")
        await q.offer_many([(61, 0), (62, 0), (63, 0)], groups=["g", "g", "h"])
        grouped = await q.receive_many(10, 30, timeout=5)
        assert sorted(m.value for m in grouped) == [61, 63]
        await q.set_group_concurrency(2)
        assert await grouped[0].release()
        grouped = [*grouped[1:], *await q.receive_many(10, 30, timeout=5)]
        assert sorted(m.value for m in grouped) == [61, 62, 63]
        for m in grouped:
            assert await m.ack(confirm=True)
        await q.offer(64, 0, group="g")
        assert await asyncio.wait_for(q.take(), 5) == 64
        await q.set_group_concurrency(1)
        assert await q.counts() == QueueCounts(0, 0, 0, 0, None)
        # Headers, expiry and recurring items as the same user (a cron schedule lists its times
        # with a HGET of its record; each hand-out writes the next occurrence).
        await q.offer(400, 0, headers={"h": "v"}, expires=60)
        assert await asyncio.wait_for(q.take_with_headers(), 5) == (400, {"h": "v"})
        await q.schedule("tick", 500, every=0.05)
        assert [await asyncio.wait_for(q.take(), 5) for _ in range(2)] == [500, 500]
        await q.schedule("cron", 501, cron="0 0 1 1 *")
        assert (await q.counts()).recurring == 2
        assert await q.cancel("tick")
        assert await q.cancel("cron")
        await until(lambda: _nothing_left(q))
        # Keys, leases and dead letters as the same user.
        assert (await q.offer(200, 60, key="k200")).added
        assert not (await q.offer(201, 60, key="k200")).added
        assert (await q.offer(202, 60, key="k200", replace=True)).replaced
        assert (await q.get("k200")).value == 202  # type: ignore[union-attr]
        assert await q.reschedule("k200", 0.05) is not None
        await q.offer_many([(300, 60), (301, 60)], keys=["k300", None])
        assert await q.cancel("k300")
        # Deduplication windows: opened, read, trimmed, counted.
        assert (await q.offer(302, 60, key="k302", dedupe_for=0.05)).added
        assert await q.cancel("k302")
        assert (await q.offer(303, 60, key="k302")).deduplicated
        [content] = await q.offer_many([(304, 60)], dedupe_by_content=True, dedupe_for=60)
        assert content.added  # type: ignore[attr-defined]
        assert await q.cancel(content.key)  # type: ignore[attr-defined]
        await asyncio.sleep(0.06)
        assert (await q.offer(305, 60, key="k302", dedupe_for=60)).added  # the window ended, trimmed
        assert (await q.counts()).deduplicating == 2
        assert await q.cancel("k302")
        # The event stream: turned on, written by the scripts, read, turned off.
        await q.set_events(100)
        await q.offer(306, 60, key="k306")
        assert await q.cancel("k306")
        events = [e async for e in q.events("0", follow=False)]
        assert [(e.kind, e.key) for e in events] == [("offered", "k306"), ("cancelled", "k306")]
        following = q.events(events[0].id)
        assert (await anext(following)).kind == "cancelled"  # a blocking read
        await following.aclose()
        await q.set_events(None)
        msg = await q.receive(30, timeout=5)
        assert msg is not None
        assert msg.value == 202
        assert await msg.extend(30)
        async with msg.lease(every=0.05) as lease:
            await until(lambda: lease.extensions >= 2)  # EXTEND allowed
        assert await msg.nack(dead_letter=True)
        [letter] = await q.dead_letters()
        assert (letter.value, letter.reason) == (202, "nacked")
        assert await q.requeue_dead_letters(delay=60) == 1
        await client.rpush(q.keys.dead_letter, b"1")
        assert await q.purge_dead_letters() == 1
        # peek as the same user: 301 (unkeyed) and 202, requeued from the dead letters without its key
        assert sorted((p.value, p.key) for p in await q.peek(5)) == [(202, None), (301, None)]
        # The worker as the same user: ack, retry, dead letter.
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
        await until(lambda: takers_waiting(q) == 1)
        start = loop.time()
    # A few round trips; a close that waited for the take would run into close_timeout_s (5 s).
    assert loop.time() - start <= 1.0
    with pytest.raises(QueueClosedError):
        await taker
    # The client's safety poll (TIME, ZRANGE and LLEN, pipelined) as the same user.
    polled: DelayedQueue[int] = make_queue("orders", redis=client, safety_poll_s=0.2)
    async with polled:
        runtime = runtime_for(client)
        assert runtime is not None
        assert runtime.safety_poll is not None
        poll = runtime.safety_poll
        before = poll.polls
        await until(lambda: poll.polls >= before + 2, timeout_s=10)
    # Durable writes: WAIT is allowed; this server has no replica, so none confirms.
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


@pytest.mark.parametrize("refused", ["the channel", "evalsha", "the password"])
async def test_an_open_the_acl_refuses_raises_it_and_no_background_task_logs_it(
        refused: str, acl_client: Any, make_queue: Any, redis_server: Any, caplog: pytest.LogCaptureFixture) -> None:
    version = tuple(int(x) for x in server_version(redis_server.kind.binary).split(".")[:2])
    rules = acl_rules("orders", version)
    if refused == "the channel":  # SUBSCRIBE refused
        rules = [r for r in rules if not r.startswith("&")]
    elif refused == "evalsha":  # the first transfer refused
        rules.remove("+evalsha")
    client = await acl_client("consumer", "wrong" if refused == "the password" else "secret", rules)
    q: DelayedQueue[int] = make_queue("orders", redis=client, open_timeout_s=30)
    caplog.set_level(logging.DEBUG, logger="aiodelayq")
    loop = asyncio.get_running_loop()
    start = loop.time()
    with pytest.raises(AccessDeniedError):
        await q.open()
    assert loop.time() - start < 15  # raised, not waited out (open_timeout_s=30)
    await q.aclose()
    # The caller got the error; the subscriber, the transfer task and the opening task reported nothing.
    assert [r.getMessage() for r in caplog.records if r.name == "aiodelayq" and r.levelno >= logging.WARNING] == []


async def test_a_refused_channel_is_named_with_the_acl_rule_that_grants_it(acl_client: Any, make_client: Any,
                                                                           make_queue: Any, redis_server: Any) -> None:
    version = tuple(int(x) for x in server_version(redis_server.kind.binary).split(".")[:2])
    name = "jobs*[x]"  # the rule escapes the glob characters of its channel
    rules = acl_rules(name, version)
    [grant] = [r for r in rules if r.startswith("&")]
    client = await acl_client("consumer", "secret", [r for r in rules if r != grant])
    q: DelayedQueue[int] = make_queue(name, redis=client)
    with pytest.raises(AccessDeniedError) as opened:  # the consumer's SUBSCRIBE
        await q.open()
    assert q.keys.channel in str(opened.value)
    assert grant in str(opened.value)
    # The producer's PUBLISH, inside the offer script: named the same way. The script's writes before
    # it stay: the offer may have been applied.
    with pytest.raises(AccessDeniedError) as offered:
        await q.offer(1, 0)
    assert q.keys.channel in str(offered.value)
    assert grant in str(offered.value)
    assert offered.value.maybe_applied
    # The rule the errors name is the one missing: granted, the queue opens and the offered item comes.
    kwargs = client.connection_pool.connection_kwargs
    admin = make_client(f"redis://{kwargs['host']}:{kwargs['port']}/0")
    await admin.execute_command("ACL", "SETUSER", "consumer", grant)
    async with make_queue(name, redis=client) as granted:
        assert await asyncio.wait_for(granted.take(), 5) == 1


async def test_a_queue_refused_its_channel_leaves_the_open_queues_of_its_client_working(
        acl_client: Any, make_queue: Any, redis_server: Any, caplog: pytest.LogCaptureFixture) -> None:
    version = tuple(int(x) for x in server_version(redis_server.kind.binary).split(".")[:2])
    allowed, refused = acl_rules("allowed", version), acl_rules("refused", version)
    [grant] = [r for r in refused if r.startswith("&")]
    resets = {"on", ">secret", "resetkeys", "resetchannels", "-@all"}
    client = await acl_client("consumer", "secret", [*allowed, *(r for r in refused if r not in resets | {grant})])
    caplog.set_level(logging.DEBUG, logger="aiodelayq")
    # Only the channel wakes the open queue's transfer task here (its safety poll is a minute away).
    async with make_queue("allowed", redis=client, safety_poll_s=60) as working:
        other: DelayedQueue[int] = make_queue("refused", redis=client)
        with pytest.raises(AccessDeniedError) as opened:  # its SUBSCRIBE shares the open queue's connection
            await other.open()
        assert other.keys.channel in str(opened.value)
        assert working.keys.channel not in str(opened.value)
        await working.offer(1, 0.2)
        assert await asyncio.wait_for(working.take(), 10) == 1
    assert [r.getMessage() for r in caplog.records if r.name == "aiodelayq" and r.levelno >= logging.WARNING] == []


async def test_the_first_take_without_permission_to_pop_raises_it(acl_client: Any, make_queue: Any) -> None:
    client = await acl_client("nopop", "secret", [r for r in acl_rules("orders") if r != "+lpop"])
    async with make_queue("orders", redis=client) as q:
        await q.offer(1, 0)
        with pytest.raises(AccessDeniedError):
            await asyncio.wait_for(q.take(), 5)
        with pytest.raises(AccessDeniedError):
            await asyncio.wait_for(q.receive(30), 5)


async def _nothing_left(q: DelayedQueue[int]) -> bool:
    """No item is pending or ready (a recurring item's last occurrence may still be on its way)."""
    counts = await q.counts()
    if counts.ready:
        await q.poll()
    return counts == QueueCounts(0, 0, 0, 0, None)


async def test_the_minimal_acl_of_a_name_with_glob_characters_covers_that_queue_only(
        acl_client: Any, make_queue: Any) -> None:
    client = await acl_client("glob-user", "secret", acl_rules("jobs*[x]"))
    mine: DelayedQueue[int] = make_queue("jobs*[x]", redis=client)
    await mine.offer(1, 60)
    assert (await mine.counts()).pending == 1
    with pytest.raises(AccessDeniedError):
        await make_queue("jobs-other-x", redis=client).counts()  # a glob would have matched it
