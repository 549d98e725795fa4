"""Faults that must not stop delivery: killed pub/sub connections, malformed elements, undecodable
payloads, garbage in the queue's keys, pooled connections the server closed while idle."""

from __future__ import annotations

import asyncio
import logging
import os
import struct
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from redis.asyncio import Redis

from aiodelayq import DelayedQueue, QueueCounts
from aiodelayq._runtime.client_runtime import runtime_for
from tests.helpers import queue_on, server_ms, until


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
        await until(lambda: _dead_count(q), timeout_s=5)
        assert q.stats.undecodable == 1
    [letter] = await q.dead_letters()
    assert (letter.raw, letter.reason, letter.delivery_count, letter.value) == (b"{not json", "undecodable", 1, None)


async def _dead_count(q: DelayedQueue[Any]) -> bool:
    return len(await q.dead_letters()) == 1


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(payloads=st.lists(st.binary(max_size=40), min_size=1, max_size=8),
       delays=st.lists(st.floats(min_value=0, max_value=0.05), min_size=8, max_size=8),
       name=st.text(min_size=1, max_size=20).filter(lambda s: s.strip() != ""),
       legacy=st.booleans())
def test_any_payload_name_and_delay_round_trip(redis_server: Any, payloads: list[bytes], delays: list[float],
                                              name: str, legacy: bool) -> None:
    async def run() -> None:
        async with queue_on(redis_server.url, f"aiodelayq-test:{os.urandom(4).hex()}:{name}", codec="bytes",
                            wire_format="redisson-legacy" if legacy else "redisson") as (_, q):
            await q.offer_many(list(zip(payloads, delays, strict=False)))
            assert sorted(await q.read_all()) == sorted(payloads)
            assert all([await q.contains(p) for p in payloads])
            async with q:
                got = [await asyncio.wait_for(q.take(), 5) for _ in payloads]
            assert sorted(got) == sorted(payloads)
            assert await q.dead_letters() == []

    asyncio.run(run())


@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
@given(garbage=st.lists(st.binary(max_size=64), min_size=1, max_size=6),
       scores=st.lists(st.floats(min_value=-1e15, max_value=1e12, allow_nan=False), min_size=6, max_size=6),
       list_garbage=st.lists(st.binary(max_size=32), max_size=4))
def test_garbage_in_the_queue_keys_never_stops_the_queue(redis_server: Any, garbage: list[bytes],
                                                        scores: list[float], list_garbage: list[bytes]) -> None:
    async def run() -> None:
        async with queue_on(redis_server.url, f"aiodelayq-test:{os.urandom(6).hex()}", codec="str") as (client, q):
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
