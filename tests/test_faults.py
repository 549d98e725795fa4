"""Faults that must not stop delivery: killed pub/sub connections, malformed elements, undecodable
payloads, garbage in the queue's keys."""

from __future__ import annotations

import asyncio
import logging
import os
import struct
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from redis.asyncio import Redis

from aiodelayq import DelayedQueue
from aiodelayq._runtime import runtime_for
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
