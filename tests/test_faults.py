"""Faults from outside the library's calls, which must neither stop delivery nor lose what was
confirmed: connections killed (pub/sub and all a client's), a server stalled, paused, killed and
restarted from its AOF, a consumer process killed, pooled connections the server closed while idle;
and bad data others wrote into a queue's keys or channel."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import signal
import struct
import sys
import textwrap
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from redis.asyncio import Redis

from aiodelayq import BackendError, DelayedQueue, QueueCounts
from aiodelayq._runtime.client_runtime import runtime_for
from aiodelayq.testing import ThrowawayServer
from tests.faults import stall_server
from tests.helpers import dead_letters_are, first_line, queue_on, server_ms, server_past, takers_waiting, until

# -- killed connections ----------------------------------------------------------------------------


async def _pubsub_clients(admin: Redis) -> int:
    return len(await admin.client_list(_type="pubsub"))


async def test_killed_pubsub_connection_resubscribes_and_delivery_goes_on(own_server: Any, make_client: Any,
                                                                          make_queue: Any) -> None:
    server = own_server()
    client, admin = make_client(server), make_client(server)
    q = make_queue("orders", redis=client, safety_poll_s=300)  # the safety poll must not be what saves us
    async with q:
        subscriber = runtime_for(client).subscriber
        for round_ in range(3):
            before = subscriber.reconnects
            await q.offer("far", 600)  # arms a timer far away
            killed = await admin.execute_command("CLIENT", "KILL", "TYPE", "pubsub")
            assert killed == 1
            await until(lambda: _pubsub_clients(admin), timeout_s=10)
            # Offered after the resubscription: only the re-established channel can re-arm us.
            await q.offer(f"after-kill-{round_}", 0.2)
            assert await asyncio.wait_for(q.take(), 10) == f"after-kill-{round_}"
            assert subscriber.reconnects >= before  # redis-py may reconnect before we notice
        await q.clear()


async def test_items_offered_while_pubsub_is_down_are_compensated(own_server: Any, make_client: Any,
                                                                  make_queue: Any) -> None:
    server = own_server()
    client, admin = make_client(server), make_client(server)
    q = make_queue("orders", redis=client, safety_poll_s=300)
    async with q:
        await q.offer("far", 600)
        # Offer, then kill right away: the PUBLISH may be lost, the resubscribe must compensate.
        await q.offer("soon", 0)
        await admin.execute_command("CLIENT", "KILL", "TYPE", "pubsub")
        assert await asyncio.wait_for(q.take(), 10) == "soon"


async def _consume_reliably(q: DelayedQueue[int], n: int, acked: Counter[int], stop_after_s: float) -> None:
    """receive_many + ack until every id in range(n) was received at least once; Redis errors are retried."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + stop_after_s
    while len(acked) < n and loop.time() < deadline:
        try:
            msgs = await q.receive_many(200, visibility_timeout=2.0, timeout=1.0)
        except BackendError:
            await asyncio.sleep(0.05)
            continue
        for msg in msgs:
            # Delivered = received: an ack whose reply is lost to a killed connection may still
            # have been applied, so counting only confirmed acks would call a processed item lost.
            acked[msg.value] += 1
            try:
                await msg.ack()
            except BackendError:
                continue  # maybe not acked: delivered again later (a duplicate, never a loss)


async def test_repeated_client_kills_lose_nothing_reliable_and_bounded_plain(own_server: Any, make_client: Any,
                                                                             make_queue: Any) -> None:
    server = own_server()
    client, admin = make_client(server), make_client(server)
    reliable: DelayedQueue[int] = make_queue("reliable", redis=client, safety_poll_s=1.0)
    plain: DelayedQueue[int] = make_queue("plain", redis=client, safety_poll_s=1.0)
    n = 3000
    await reliable.offer_many([(i, random.uniform(0, 2.0)) for i in range(n)])
    await plain.offer_many([(i, random.uniform(0, 2.0)) for i in range(n)])
    acked: Counter[int] = Counter()
    taken: Counter[int] = Counter()

    async def take_plain() -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 30
        while len(taken) < n and loop.time() < deadline:
            item = await plain.poll(1.0)
            if item is not None:
                taken[item] += 1
            elif await plain.size() == 0 and await plain.ready_size() == 0:
                break

    async with reliable, plain:
        consumers = [asyncio.create_task(_consume_reliably(reliable, n, acked, 30)),
                     asyncio.create_task(take_plain())]
        kills = 0
        for _ in range(20):
            await asyncio.sleep(0.1)
            kills += int(await admin.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"))
            await admin.execute_command("CLIENT", "KILL", "TYPE", "pubsub")
        await asyncio.gather(*consumers)
    assert set(acked) == set(range(n))  # reliable: nothing lost
    lost = n - len(taken)
    print(f"\n{kills} connections killed; reliable lost 0 (duplicates {sum(acked.values()) - n}); "
          f"plain lost {lost} (at-most-once window)")
    assert max(taken.values()) == 1  # plain never duplicates
    assert lost <= kills  # plain: at most the item in flight on each killed connection


# -- a server stalled, killed and restarted; a consumer process killed ----------------------------------


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
        await until(lambda: takers_waiting(q) == 1)  # the consumer waits; the safety poll runs every 0.2 s
        stall = stall_server(debug_server.url, 2.0)
        # Meanwhile calls time out (after 0.5 s) and drop their connections.
        await asyncio.to_thread(stall.result, 10)
        await admin.rpush("stall", *"abcde")  # straight into the ready list, as other code may push
        await until(lambda: len(got) >= 5, timeout_s=10)
        await q.offer_many([(x, 0) for x in "fghij"])
        await asyncio.wait_for(consumer, 10)
        assert got == list("abcdefghij")
        assert await q.poll(0.3) is None


async def test_a_server_stall_loses_nothing_and_delivers_nothing_early(own_server: Any, make_client: Any,
                                                                       make_queue: Any) -> None:
    server = own_server()
    client, admin = make_client(server), make_client(server)
    q: DelayedQueue[int] = make_queue("stall", redis=client, safety_poll_s=1.0)
    async with q:
        dues = await q.offer_many([(i, 0.2 + i * 0.015) for i in range(200)])  # due over 3 s
        await until(lambda: server_past(admin, dues[20]))  # the first ones are due, the rest fall due later
        await admin.execute_command("CLIENT", "PAUSE", "2000", "ALL")  # the server stalls 2 s
        got: list[int] = []
        late: list[float] = []
        while len(got) < 200:
            # Does not hang: the last is due 3.2 s after the offer, and the stall adds 2 s.
            items = await asyncio.wait_for(q.take_many(200), 15)
            now = await server_ms(admin)
            got.extend(items)
            late.extend(now - dues[i] for i in items)
    print(f"\nstall 2 s: delivered {len(got)}/200, lateness max {max(late):.0f} ms, "
          f"median {sorted(late)[100]:.0f} ms")
    assert sorted(got) == list(range(200))  # nothing lost, nothing twice
    assert min(late) >= 0  # nothing early


@pytest.mark.slow
async def test_server_sigkill_and_aof_restart_loses_nothing(own_server: Any, make_client: Any,
                                                            make_queue: Any) -> None:
    n = 20_000
    server = own_server(appendonly="yes", appendfsync="always")
    q: DelayedQueue[int] = make_queue("orders", redis=make_client(server), safety_poll_s=1.0)
    acked: Counter[int] = Counter()
    for start in range(0, n, 1000):
        await q.offer_many([(i, random.uniform(0, 3.0)) for i in range(start, start + 1000)])
    await q.open()
    consumer = asyncio.create_task(_consume_reliably(q, n, acked, stop_after_s=60))
    await until(lambda: len(acked) >= n // 4, timeout_s=30, interval_s=0.005)
    server.kill()  # SIGKILL mid-run
    killed_at = len(acked)
    await asyncio.sleep(0.5)
    server.start()  # same port, same data directory: the AOF is replayed
    loop = asyncio.get_running_loop()
    restarted = loop.time()
    received_before = sum(acked.values())
    await until(lambda: sum(acked.values()) > received_before, timeout_s=30, interval_s=0.005)
    first_delivery_s = loop.time() - restarted
    await consumer
    recovery_s = loop.time() - restarted
    missing = set(range(n)) - set(acked)
    duplicates = sum(c - 1 for c in acked.values())
    print(f"\nSIGKILL at {killed_at} received; first delivery {first_delivery_s:.2f} s after the restart; "
          f"all {n} received {recovery_s:.1f} s after it (items fall due over 3 s); "
          f"lost {len(missing)}, duplicates {duplicates}")
    assert not missing


SCHEDULER = textwrap.dedent("""
    import asyncio, sys
    from redis.asyncio import Redis
    from aiodelayq import DelayedQueue

    async def main(url, name):
        async with DelayedQueue(Redis.from_url(url), name):
            print("open", flush=True)
            await asyncio.sleep(60)

    asyncio.run(main(sys.argv[1], sys.argv[2]))
""")


async def test_killed_only_scheduler_is_replaced_by_the_next_process_that_opens(redis_server: Any, qname: str,
                                                                                make_queue: Any,
                                                                                spawn_consumer: Any) -> None:
    child = spawn_consumer(SCHEDULER, args=[redis_server.url, qname])
    producer = make_queue()
    assert (await first_line(child)).strip() == "open"
    child.send_signal(signal.SIGKILL)
    await child.await_exit(10)
    dues = await producer.offer_many([(i, 0.1) for i in range(100)])
    await until(lambda: server_past(producer._client, max(dues)), timeout_s=5)
    assert await producer.ready_size() == 0  # nobody transferred
    async with make_queue() as consumer:
        got = sorted([await asyncio.wait_for(consumer.take(), 5) for _ in range(100)])
    assert got == list(range(100))


# -- server settings that put the queue at risk ---------------------------------------------------------


async def test_an_evicting_server_is_named_as_a_risk(own_server: Any, make_client: Any, make_queue: Any,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    client = make_client(own_server(**{"maxmemory": "100mb", "maxmemory-policy": "allkeys-lru"}))
    with caplog.at_level(logging.WARNING, logger="aiodelayq"):
        await make_queue("evict", redis=client).offer(1, 60)
        await until(lambda: "allkeys-lru" in caplog.text, timeout_s=5)


# -- bad data in the queue's keys and channel --------------------------------------------------------


async def test_malformed_elements_go_to_dead_letters_and_the_rest_is_delivered(
        client: Redis, make_queue: Any, caplog: pytest.LogCaptureFixture) -> None:
    q = make_queue(codec="str", transfer_batch=3)
    await q.offer_many([(f"good-{i}", 0) for i in range(5)])
    [good] = await client.zrange(q.keys.timeout_set, 0, 0)
    garbage = [b"", b"x", b"\x08" + b"\x00" * 20, good[:-1], good + b"!", struct.pack("<dQ", 1.0, 99) + b"short",
               os.urandom(64)]
    now = await server_ms(client)
    await client.zadd(q.keys.timeout_set, {g: now - 1000 for g in garbage})
    await client.rpush(q.keys.delay_list, *garbage)
    with caplog.at_level(logging.ERROR, logger="aiodelayq"):
        async with q:
            got = sorted([await asyncio.wait_for(q.take(), 5) for _ in range(5)])
            assert got == [f"good-{i}" for i in range(5)]
            assert q.stats.dead_lettered == len(garbage)
    letters = await q.dead_letters()
    assert sorted(d.raw for d in letters) == sorted(garbage)
    assert {(d.reason, d.delivery_count) for d in letters} == {("malformed", 0)}
    assert "dead-letter" in caplog.text
    assert await client.zcard(q.keys.timeout_set) == 0
    assert await q.size() == 0  # the list copies were removed as well


async def test_undecodable_payload_is_dead_lettered_and_take_goes_on(client: Redis, make_queue: Any) -> None:
    q = make_queue()  # json
    await client.rpush(q.keys.destination, b"{not json", b'"ok"')
    async with q:
        assert await asyncio.wait_for(q.take(), 5) == "ok"
        await until(lambda: dead_letters_are(q, 1), timeout_s=5)
        assert q.stats.undecodable == 1
    [letter] = await q.dead_letters()
    assert (letter.raw, letter.reason, letter.delivery_count, letter.value) == (b"{not json", "undecodable", 1, None)


async def test_garbage_in_the_in_flight_zset_is_moved_aside(client: Redis, make_queue: Any) -> None:
    # A receive of one message that finds garbage first moves it aside and looks again at once: the
    # message comes without waiting for the safety poll (30 s here).
    q = make_queue(safety_poll_s=30.0)
    await client.zadd(q.keys.in_flight, {b"junk": 0, b"adq\x02short": 0, b"x" * 40: 0})
    await q.offer("real", 0)
    async with q:
        msg = await q.receive(visibility_timeout=30, timeout=10)
        assert msg is not None
        assert msg.value == "real"
    letters = await q.dead_letters()
    assert sorted(d.raw for d in letters) == sorted([b"junk", b"adq\x02short", b"x" * 40])
    assert {d.reason for d in letters} == {"malformed"}


async def test_undecodable_message_is_dead_lettered_atomically(client: Redis, make_queue: Any) -> None:
    q = make_queue()
    await client.rpush(q.keys.destination, b"{not json", b'"ok"')
    async with q:
        msgs = await q.receive_many(2, visibility_timeout=30, timeout=5)
        assert [m.value for m in msgs] == ["ok"]
        assert await msgs[0].ack()
    [letter] = await q.dead_letters()
    assert (letter.raw, letter.reason) == (b"{not json", "undecodable")
    assert (letter.delivery_count, letter.decodable) == (1, False)
    assert await client.zcard(q.keys.in_flight) == 0


# Texts other programs may push, each read as json.loads reads it (or dead-lettered as undecodable).
_OTHERS_JSON = [b' {"a": 1} ', b"\t[1,\n2]\n", b"NaN", b"-Infinity", b"1E400", b"12345678901234567890123456789",
                b'{"a":1,"a":2}', b'"\\ud800"', b"1 2", b"[1] x", b"", b"  ", b"\xff\xfe", b"[" * 100_000,
                b"\xef\xbb\xbf1"]


def _as_json_loads_reads(raw: bytes) -> Any:
    try:
        return ("value", json.loads(raw.decode()))
    except (ValueError, RecursionError):
        return ("undecodable", raw)


@pytest.mark.parametrize("consume", ["take_many", "receive_many"])
async def test_json_that_other_programs_pushed_decodes_as_json_loads_does(client: Redis, make_queue: Any,
                                                                          consume: str) -> None:
    q = make_queue()  # json
    await client.rpush(q.keys.destination, *_OTHERS_JSON, b'"end"')
    got: list[Any] = []
    async with q:
        while not got or got[-1] != "end":
            if consume == "take_many":
                got += await asyncio.wait_for(q.take_many(100), 10)
            else:
                for msg in await q.receive_many(100, visibility_timeout=30, timeout=10):
                    got.append(msg.value)
                    await msg.ack()
        await until(lambda: _dead_letters_at_least(q, sum(1 for r in _OTHERS_JSON
                                                            if _as_json_loads_reads(r)[0] == "undecodable")),
                    timeout_s=10)
    expected = [_as_json_loads_reads(r) for r in _OTHERS_JSON]
    values = [v for kind, v in expected if kind == "value"]
    assert len(got) == len(values) + 1
    for a, b in zip(got, values, strict=False):  # NaN != NaN: compared by repr
        assert repr(a) == repr(b)
    letters = await q.dead_letters(limit=100)
    assert sorted(d.raw for d in letters) == sorted(v for kind, v in expected if kind == "undecodable")
    assert {d.reason for d in letters} == {"undecodable"}


async def _dead_letters_at_least(q: DelayedQueue[Any], n: int) -> bool:
    return len(await q.dead_letters(limit=100)) >= n


async def test_absurd_published_due_times_do_not_kill_the_subscriber(client: Redis, make_queue: Any) -> None:
    q = make_queue(safety_poll_s=300)
    async with q:
        runtime = runtime_for(client)
        assert runtime is not None
        for junk in ("9" * 400, "-" + "9" * 30, "1e308", "", "\x00\xff"):
            await client.publish(q.keys.channel, junk)
        await q.offer("on-time", 0.2)
        assert await asyncio.wait_for(q.take(), 3) == "on-time"
        assert runtime.subscriber._task.running
        assert runtime.subscriber._task.crashes == 0


@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
@given(garbage=st.lists(st.binary(max_size=64), min_size=1, max_size=6),
       scores=st.lists(st.floats(min_value=-1e15, max_value=1e12, allow_nan=False), min_size=6, max_size=6),
       list_garbage=st.lists(st.binary(max_size=32), max_size=4))
def test_garbage_in_the_queue_keys_never_stops_the_queue(single_server: Any, garbage: list[bytes],
                                                        scores: list[float], list_garbage: list[bytes]) -> None:
    async def run() -> None:
        async with queue_on(single_server.url, f"aiodelayq-test:{os.urandom(6).hex()}", codec="str") as (client, q):
            await client.zadd(q.keys.timeout_set, dict(zip(garbage, scores, strict=False)))
            if list_garbage:
                await client.rpush(q.keys.delay_list, *list_garbage)
            await q.offer("real", 0)
            async with q:
                # Garbage that happens to be a valid element (e.g. 16 zero bytes: a legacy element
                # with an empty payload) is delivered too; "real" must still come through.
                for _ in range(len(garbage) + 1):
                    item = await q.poll(5)
                    assert item is not None
                    if item == "real":
                        break
                else:
                    raise AssertionError("the real item never came")
            await q.read_all()
            await q.contains("x")
            await q.remove("x")
            await q.size()

    asyncio.run(run())


# -- connections the server closes while they sit idle --------------------------------------------
# The server's `timeout` (common on managed Redis and behind proxies), CLIENT KILL and a proxy's idle
# cut close a pooled connection nobody uses; the next call takes it from the pool. Each test runs on
# a server with `timeout 1` and waits until the server has closed every idle connection.

CLOSED_BY_SERVER = "closed by the server"


async def _idle_connections_closed(admin: Redis) -> bool:
    """Whether the server closed every normal connection but ``admin``'s own (which this polling
    keeps busy); pub/sub connections are not normal ones."""
    return len(await admin.client_list(_type="normal")) <= 1


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "aiodelayq" and r.levelno >= logging.WARNING]


async def test_every_queue_call_succeeds_on_a_connection_the_server_closed_while_idle(
        own_server: Any, make_client: Any, make_queue: Any, caplog: pytest.LogCaptureFixture) -> None:
    server = own_server(timeout="1")
    admin = make_client(server)
    calls: dict[str, Callable[[DelayedQueue[Any]], Awaitable[object]]] = {
        "offer": lambda q: q.offer("plain", 600),
        "offer key": lambda q: q.offer("keyed", 600, key="k-new"),
        "offer_many": lambda q: q.offer_many([("a", 600), ("b", 600)], keys=["k-a", None]),
        "cancel": lambda q: q.cancel("k1"),
        "reschedule": lambda q: q.reschedule("k2", 900),
        "get": lambda q: q.get("k3"),
        "size": lambda q: q.size(),
        "ready_size": lambda q: q.ready_size(),
        "counts": lambda q: q.counts(),
        "peek": lambda q: q.peek(5),
        "contains": lambda q: q.contains("item-4"),
        "read_all": lambda q: q.read_all(),
        "remove": lambda q: q.remove("item-5"),
        "remove_all": lambda q: q.remove_all(["item-6"]),
        "dead_letters": lambda q: q.dead_letters(),
        "requeue_dead_letters": lambda q: q.requeue_dead_letters(1, delay=600),
        "purge_dead_letters": lambda q: q.purge_dead_letters(),
        "clear": lambda q: q.clear(),
    }
    # One client per call, each with one pooled connection the server is going to close.
    queues = {name: make_queue("orders", redis=make_client(server)) for name in calls}
    setup = queues["offer"]
    await setup.offer_many([(f"item-{i}", 600) for i in range(10)], keys=[f"k{i}" for i in range(10)])
    await make_client(server).rpush(setup.keys.dead_letter, b'"dead-1"', b'"dead-2"')
    for q in queues.values():
        assert await q.size() == 10
    await until(lambda: _idle_connections_closed(admin), timeout_s=15)
    with caplog.at_level(logging.DEBUG, logger="aiodelayq"):
        for name, run in calls.items():
            try:
                await asyncio.wait_for(run(queues[name]), 10)
            except Exception as exc:
                raise AssertionError(f"{name} failed on a connection the server closed: {exc!r}") from exc
        reconnects = [r for r in caplog.records if CLOSED_BY_SERVER in r.getMessage()]
    assert len(reconnects) >= len(calls)  # every call met a closed connection, and reconnected
    assert _warnings(caplog) == []
    assert await setup.size() == 0  # the last call, clear(), ran


@pytest.mark.waits
async def test_consumers_of_an_open_queue_reconnect_quietly_after_idle_closes(
        own_server: Any, make_client: Any, make_queue: Any, caplog: pytest.LogCaptureFixture) -> None:
    server = own_server(timeout="1")
    admin, producer_client = make_client(server), make_client(server)
    producer = make_queue("orders", redis=producer_client)
    q = make_queue("orders", redis=make_client(server), safety_poll_s=300)  # no poll keeps a connection busy
    handled: list[str] = []

    async def handler(item: str) -> None:
        handled.append(item)

    caplog.set_level(logging.DEBUG, logger="aiodelayq")
    async with q:
        await until(lambda: _idle_connections_closed(admin), timeout_s=15)
        await producer.offer("taken", 0)  # the transfer (or the pump's POP) meets a closed connection
        assert await asyncio.wait_for(q.take(), 10) == "taken"
        await until(lambda: _idle_connections_closed(admin), timeout_s=15)
        await producer.offer("received", 0)
        msg = await q.receive(30, timeout=10)
        assert msg is not None
        assert msg.value == "received"
        await until(lambda: _idle_connections_closed(admin), timeout_s=15)
        assert await msg.extend(30)
        await until(lambda: _idle_connections_closed(admin), timeout_s=15)
        assert await msg.ack(confirm=True)
        worker = q.worker(handler, concurrency=2)
        running = asyncio.create_task(worker.run())
        try:
            await until(lambda: _idle_connections_closed(admin), timeout_s=15)
            await producer.offer("handled", 0)
            await until(lambda: handled == ["handled"], timeout_s=10)
        finally:
            worker.stop()
            await asyncio.wait_for(running, 10)
    assert [r for r in caplog.records if CLOSED_BY_SERVER in r.getMessage()]
    assert _warnings(caplog) == []
    assert await producer.counts() == QueueCounts(0, 0, 0, 0, None)


@pytest.mark.waits
async def test_metrics_and_the_cli_watch_read_through_idle_closes(own_server: Any, make_client: Any,
                                                                  make_queue: Any) -> None:
    from prometheus_client import CollectorRegistry

    from aiodelayq.prometheus import QueueMetrics
    server = own_server(timeout="1")
    admin = make_client(server)
    q = make_queue("orders", redis=make_client(server))
    await q.offer("x", 600)
    with QueueMetrics(CollectorRegistry()) as metrics:
        metrics.track(q)
        await metrics.refresh()
        await until(lambda: _idle_connections_closed(admin), timeout_s=15)
        await metrics.refresh()
        assert metrics.snapshot()[q.name].pending == 1
        assert metrics.scrape_errors_total.labels(q.name)._value.get() == 0
    # `watch` on one client: its second refresh, 3.5 s after the first, finds that connection closed
    # (the server counts idle time in whole seconds: a connection idle 2-3 s is closed). Without a
    # terminal only the last frame is printed: that refresh's.
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "aiodelayq", "watch", "orders", "--interval", "3.5", "--count", "2", "--redis-url",
        server.url, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "NO_COLOR": "1", "COLUMNS": "200"})
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    assert "trying again" not in out.decode()  # how a refresh that failed shows
    assert "│ orders │" in out.decode()
