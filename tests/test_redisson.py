"""Sharing a queue with Redisson: Redisson's own Lua scripts (its offer, transfer and remove of both
element formats) on queues aiodelayq writes and reads, the element layouts of each ``wire_format``, and
the real Java Redisson (3.52.0: ``Bc0Lc0`` elements; 3.20.1: legacy ``dLc0``), one JVM per build for this
module (``tests/redisson_java.py``), with string payloads on both sides (Redisson's ``StringCodec``,
aiodelayq's ``"str"`` codec). The Java tests are marked ``java``: they run on one server kind."""

from __future__ import annotations

import asyncio
import os
import struct
import time
from collections.abc import Iterator
from typing import Any

import pytest
from redis.asyncio import Redis

from aiodelayq import DelayedQueue, QueueKeys
from tests import redisson_scripts as rs
from tests.conftest import ServerInfo
from tests.helpers import server_ms, server_past, until
from tests.redisson_java import BUILDS, DRIVER_SOURCE, REPO_ROOT, Build, JavaRedisson, compile_driver, unavailable

# -- Redisson's scripts ------------------------------------------------------------------------------


async def _redisson_offer(client: Redis, keys: Any, payload: bytes, delay_ms: int, legacy: bool) -> None:
    # Redisson computes the due time on the client (System.currentTimeMillis() + delay).
    due = int(await server_ms(client)) + delay_ms
    script = rs.OFFER_LEGACY if legacy else rs.OFFER_CURRENT
    random_id: Any = int.from_bytes(os.urandom(8), "big", signed=True) if legacy else os.urandom(8)
    await client.eval(script, 4, keys.destination, keys.timeout_set, keys.delay_list, keys.channel,
                      due, random_id, payload)


async def _redisson_transfer(client: Redis, keys: Any, legacy: bool) -> Any:
    script = rs.TRANSFER_LEGACY if legacy else rs.TRANSFER_CURRENT
    return await client.eval(script, 3, keys.destination, keys.timeout_set, keys.delay_list,
                             int(await server_ms(client)), 100)


@pytest.mark.parametrize("legacy", [False, True], ids=["redisson>=3.21.1", "redisson<3.21.1"])
async def test_elements_written_by_redisson_scripts_are_delivered(client: Redis, make_queue: Any,
                                                                  legacy: bool) -> None:
    q = make_queue(codec="str")
    for i in range(5):
        await _redisson_offer(client, q.keys, f"java-{i}".encode(), 100 + 50 * i, legacy)
    assert await q.size() == 5
    assert await q.read_all() == [f"java-{i}" for i in range(5)]
    assert await q.contains("java-3")
    assert await q.remove("java-4")
    async with q:
        got = [await asyncio.wait_for(q.take(), 5) for _ in range(4)]
    assert got == [f"java-{i}" for i in range(4)]


@pytest.mark.parametrize(("wire_format", "strict"), [("redisson", True), ("redisson-legacy", True),
                                                     ("redisson", False)])
async def test_redisson_scripts_move_and_remove_our_elements(client: Redis, make_queue: Any,
                                                             wire_format: str, strict: bool) -> None:
    legacy = wire_format == "redisson-legacy"
    q = make_queue(codec="str", wire_format=wire_format, strict=strict)
    dues = await q.offer_many([("a", 0), ("b", 0), ("c", 0), ("later", 60)])
    await until(lambda: server_past(client, max(dues[:3])))  # due by the server's clock: Redisson's transfer moves them
    remove = rs.REMOVE_LEGACY if legacy else rs.REMOVE_CURRENT
    # Redisson's remove() scans its insertion-order list: it sees strict elements only (documented).
    assert await client.eval(remove, 2, q.keys.delay_list, q.keys.timeout_set, b"b") == int(strict)
    if not strict:
        assert await q.remove("b")
    next_due = await _redisson_transfer(client, q.keys, legacy)
    assert next_due is not None  # "later" is still pending
    assert sorted(await client.lrange(q.keys.destination, 0, -1)) == [b"a", b"c"]
    assert await q.read_all() == ["later"]


async def test_both_wire_formats_in_one_queue(client: Redis, make_queue: Any, qname: str) -> None:
    current = make_queue(codec="str", strict=True)
    legacy = make_queue(codec="str", wire_format="redisson-legacy")
    fast = make_queue(codec="str")
    await current.offer("new-1", 0.05)
    await legacy.offer("old-1", 0.05)
    await _redisson_offer(client, current.keys, b"java-old", 50, legacy=True)
    await _redisson_offer(client, current.keys, b"java-new", 50, legacy=False)
    await current.offer("new-2", 60)
    await legacy.offer("old-2", 60)
    await fast.offer("fast-1", 0.05)
    await fast.offer("fast-2", 60)
    lengths = sorted(len(e) for e in await client.lrange(current.keys.delay_list, 0, -1))
    assert lengths == sorted([17 + 5, 16 + 5, 16 + 8, 17 + 8, 17 + 5, 16 + 5])
    assert await current.size() == 8
    got = await current.read_all()  # due order; the ~50 ms group may share milliseconds
    assert sorted(got[:5]) == sorted(["new-1", "old-1", "java-old", "java-new", "fast-1"])
    assert sorted(got[5:]) == sorted(["new-2", "old-2", "fast-2"])
    assert await current.remove("fast-2")
    assert await legacy.contains("new-2")
    assert await current.contains("old-2")
    assert await current.remove("old-2")
    assert await legacy.remove("new-2")
    async with current:
        got = {await asyncio.wait_for(current.take(), 5) for _ in range(5)}
    assert got == {"new-1", "old-1", "java-old", "java-new", "fast-1"}
    assert await current.size() == 0


async def test_lengths_are_checked_so_formats_are_never_confused(client: Redis, make_queue: Any) -> None:
    q = make_queue(codec="bytes")
    # A legacy element whose random double starts with byte 8 and whose payload is 16+ bytes: a
    # reader that only looked at the first byte would take it for the current format.
    payload = b"P" * 20
    legacy_like = struct.pack("<dQ", struct.unpack("<d", b"\x08" + os.urandom(7))[0], len(payload)) + payload
    assert legacy_like[0] == 8
    # A current element whose payload starts like a legacy length field.
    current = b"\x08" + os.urandom(8) + struct.pack("<Q", 9) + struct.pack("<Q", 1) + b"x"
    await client.rpush(q.keys.delay_list, legacy_like, current)
    await client.zadd(q.keys.timeout_set, {legacy_like: 1, current: 2})
    assert await q.read_all() == [payload, struct.pack("<Q", 1) + b"x"]
    async with q:
        assert await q.take() == payload
        assert await q.take() == struct.pack("<Q", 1) + b"x"
    assert await q.dead_letters() == []


async def test_redisson_remove_cancels_redisson_offers_in_a_queue_we_serve(client: Redis, make_queue: Any) -> None:
    q = make_queue(codec="str")
    async with q:
        await _redisson_offer(client, q.keys, b"java-cancel-me", 300, legacy=False)
        await _redisson_offer(client, q.keys, b"java-keep", 300, legacy=False)
        await q.offer("python-fast", 0.3)
        assert await client.eval(rs.REMOVE_CURRENT, 2, q.keys.delay_list, q.keys.timeout_set, b"java-cancel-me") == 1
        got = {await asyncio.wait_for(q.take(), 5) for _ in range(2)}
        assert got == {"java-keep", "python-fast"}
        assert await q.poll(0.2) is None
    assert await client.llen(q.keys.delay_list) == 0  # our transfer LREMed Java's element as Redisson does


# -- element layouts -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("wire_format", "strict", "id_len"), [
    ("redisson", False, 20), ("redisson", True, 8), ("redisson-legacy", False, None)])
async def test_element_layout_matches_wire_format(client: Redis, make_queue: Any, wire_format: str,
                                                  strict: bool, id_len: int | None) -> None:
    q = make_queue(codec="str", wire_format=wire_format, strict=strict)
    await q.offer("payload", 60)
    [element] = await client.zrange(q.keys.timeout_set, 0, -1)
    if id_len is None:  # legacy dLc0
        assert len(element) == 8 + 8 + len("payload")
        assert struct.unpack_from("<Q", element, 8)[0] == len("payload")
    else:  # Bc0Lc0
        assert element[0] == id_len
        assert len(element) == 1 + id_len + 8 + len("payload")
        assert struct.unpack_from("<Q", element, 1 + id_len)[0] == len("payload")
    if id_len == 20:
        assert element[1:5] == b"adq\x01"
    assert element.endswith(b"payload")
    # Fast elements stay out of Redisson's insertion-order list; strict ones are in both.
    assert await client.lrange(q.keys.delay_list, 0, -1) == ([] if id_len == 20 else [element])
    assert q.strict == strict
    assert q.element_kind == {20: "fast", 8: "strict", None: "legacy"}[id_len]


async def test_strict_mode_keeps_redissons_list_exactly(client: Redis, make_queue: Any) -> None:
    q = make_queue(strict=True)
    await q.offer_many([(i, 0.05 * (i % 3)) for i in range(30)])
    assert await client.llen(q.keys.delay_list) == 30
    async with q:
        got = [await q.take() for _ in range(30)]
    assert sorted(got) == list(range(30))
    assert await client.llen(q.keys.delay_list) == 0  # LREMed as Redisson's transfer does
    assert await client.zcard(q.keys.timeout_set) == 0


# -- the real Java Redisson ------------------------------------------------------------------------------

N = 40  # items per delivery test: enough to spread due times, cheap for Java's one-by-one poll


@pytest.fixture(scope="module", params=BUILDS, ids=[b.version for b in BUILDS])
def java(request: pytest.FixtureRequest, redis_server: ServerInfo,
         tmp_path_factory: pytest.TempPathFactory) -> Iterator[JavaRedisson]:
    build: Build = request.param
    reason = unavailable(build)
    if reason:
        pytest.skip(f"Java Redisson interop not run: {reason}")
    classes = compile_driver(build, tmp_path_factory.getbasetemp() / "redisson-driver")
    address = redis_server.url.rsplit("/", 1)[0]  # Redisson takes redis://host:port
    if redis_server.cluster:  # the driver's cluster mode: every node of the session cluster
        address = "cluster:" + ",".join(f"redis://{h}:{p}" for h, p in redis_server.nodes)
    with JavaRedisson(build, classes, address) as client:
        yield client


async def jcall(java: JavaRedisson, op: str, **args: Any) -> Any:
    """One driver command, off the event loop (the JVM answers while Python consumers run)."""
    return await asyncio.to_thread(java.call, op, **args)


def python_kinds(java: JavaRedisson) -> list[dict[str, Any]]:
    """The aiodelayq options whose elements this Redisson build's transfer reads."""
    if java.build.wire_format == "redisson-legacy":
        return [{"wire_format": "redisson-legacy"}]
    return [{"strict": False}, {"strict": True}]


def other_kinds(java: JavaRedisson) -> list[dict[str, Any]]:
    """The aiodelayq options whose elements this build's transfer cannot read."""
    if java.build.wire_format == "redisson-legacy":
        return [{"strict": False}, {"strict": True}]
    return [{"wire_format": "redisson-legacy"}]


@pytest.mark.java
async def test_python_offers_are_delivered_by_javas_transfer_alone_and_none_early(
        java: JavaRedisson, make_queue: Any, client: Redis, qname: str) -> None:
    for index, options in enumerate(python_kinds(java)):
        q = make_queue(name=f"{qname}-{index}", codec="str", **options)
        items = [f"py-{i}" for i in range(N)]
        dues = await q.offer_many([(item, 0.3 + i * 0.02) for i, item in enumerate(items)])
        due_of = dict(zip(items, dues, strict=True))
        got = await jcall(java, "drain", name=q.name, count=N, timeout_ms=10_000)  # Java's transfer only
        assert sorted(item for item, _ in got) == sorted(items), options
        # Java polls on this machine's clock, the server's TIME is the same clock: never early.
        early = [(item, at, due_of[item]) for item, at in got if at < due_of[item] - 1]
        assert early == [], options
        assert await client.zcard(q.keys.timeout_set) == 0
        assert await client.llen(q.keys.delay_list) == 0
        await jcall(java, "destroy", name=q.name)


@pytest.mark.java
async def test_keyed_python_items_are_delivered_by_javas_transfer_and_their_keys_are_then_absent(
        java: JavaRedisson, make_queue: Any, client: Redis, qname: str) -> None:
    for index, options in enumerate(python_kinds(java)):
        q = make_queue(name=f"{qname}-keyed-{index}", codec="str", **options)
        items = [f"key-{i}" for i in range(N)]
        await q.offer_many([(item, 0.3 + i * 0.02) for i, item in enumerate(items)], keys=items)
        assert (await q.offer("replaced", 0.3, key="key-0", replace=True)).replaced
        assert await q.cancel("key-1")
        assert (await q.get("key-2")).value == "key-2"  # type: ignore[union-attr]
        got = await jcall(java, "drain", name=q.name, count=N - 1, timeout_ms=10_000)  # Java's transfer only
        assert sorted(item for item, _ in got) == sorted(["replaced", *items[2:]]), options
        # Java moved them without touching the key index: the keys read as absent, and are free.
        for key in items[:5]:
            assert await q.get(key) is None
            assert not await q.cancel(key)
            assert await q.reschedule(key, 1) is None
        assert (await q.offer("again", 60, key="key-3")).added
        assert await client.zcard(q.keys.timeout_set) == 1
        assert await client.llen(q.keys.delay_list) == (1 if options.get("strict") or "wire_format" in options else 0)
        await jcall(java, "destroy", name=q.name)


@pytest.mark.java
async def test_a_java_consumer_taking_an_item_leaves_no_delivered_event(java: JavaRedisson, make_queue: Any,
                                                                        qname: str) -> None:
    [options, *_] = python_kinds(java)
    q = make_queue(name=f"{qname}-events", codec="str", **options)
    await q.set_events(1000)
    await q.offer("to-java", 0.05, key="k")
    [(item, _at)] = await jcall(java, "drain", name=q.name, count=1, timeout_ms=10_000)  # Java's transfer and take
    assert item == "to-java"
    assert [(e.kind, e.key) for e in await q.recent_events()] == [("offered", "k")]
    await jcall(java, "destroy", name=q.name)


@pytest.mark.java
async def test_java_never_sees_a_grouped_item(java: JavaRedisson, make_queue: Any, client: Redis, qname: str) -> None:
    q = make_queue(name=f"{qname}-grouped", codec="str")
    items = [f"g-{i}" for i in range(6)]
    await q.offer_many([(item, 0.2) for item in items], groups=["a", "b"] * 3)
    # Java's transfer runs for 1.5 s past their due time and its consumer waits: it gets none of them.
    got = await jcall(java, "drain", name=q.name, count=1, timeout_ms=1_500)
    assert got == []
    assert await client.zcard(q.keys.timeout_set) == 0
    assert await client.zcard(q.keys.grouped) == 6
    assert await client.llen(q.keys.destination) == 0
    async with q:
        taken = [await asyncio.wait_for(q.take(), 5) for _ in items]
    assert [v for v in taken if v in items[0::2]] == items[0::2]  # group a, in order
    assert sorted(taken) == sorted(items)
    await jcall(java, "destroy", name=q.name)


@pytest.mark.java
async def test_javas_transfer_reads_aiodelayqs_consumer_wake_up_as_a_due_time(
        java: JavaRedisson, make_queue: Any, client: Redis, qname: str) -> None:
    # aiodelayq publishes '+<server ms>' when consumers should look again and nothing fell due (here:
    # a concurrency limit set). Java's transfer reads it as a due time reached: it transfers.
    q = make_queue(name=f"{qname}-wake", codec="str", **python_kinds(java)[0])
    await jcall(java, "open", name=q.name)
    await q.offer("item", 3600)  # Java aims at an hour from now
    (element,) = await client.zrange(q.keys.timeout_set, 0, -1)
    await client.zadd(q.keys.timeout_set, {element: await server_ms(client) - 1000}, xx=True)  # due, unannounced
    assert await jcall(java, "drain", name=q.name, count=1, timeout_ms=500) == []
    await q.set_concurrency_limit(5)
    got = await jcall(java, "drain", name=q.name, count=1, timeout_ms=10_000)
    assert [item for item, _ in got] == ["item"]
    await jcall(java, "destroy", name=q.name)


@pytest.mark.java
async def test_java_offers_are_delivered_by_aiodelayq_alone(java: JavaRedisson, make_queue: Any,
                                                             client: Redis) -> None:
    q = make_queue(codec="str")
    items = [f"java-{i}" for i in range(N)]
    offered_at_ms = time.time() * 1000
    await jcall(java, "offer", name=q.name, items=items, delay_ms=1500)
    await jcall(java, "destroy", name=q.name)  # Java's transfer stops: only aiodelayq's can move them
    assert await q.size() == N
    got: list[str] = []
    first_taken_at_ms: float | None = None
    async with q:
        while len(got) < N:
            got.extend(await asyncio.wait_for(q.take_many(N), 10))
            first_taken_at_ms = first_taken_at_ms or time.time() * 1000
    assert sorted(got) == sorted(items)
    # Each Java due time is at least offered_at + 1500 ms (Java's clock is this machine's, as the
    # server's is): none was taken early.
    assert first_taken_at_ms is not None
    assert first_taken_at_ms >= offered_at_ms + 1500 - 1
    assert await client.zcard(q.keys.timeout_set) == 0
    assert await client.llen(q.keys.delay_list) == 0  # Java's list entries went with them


@pytest.mark.java
async def test_each_shard_of_a_sharded_queue_is_a_redisson_queue_both_ways(
        java: JavaRedisson, client: Redis, drop_keys: Any, qname: str) -> None:
    # Shard i is an ordinary queue (q.shard_names[i]): Java's RDelayedQueue of that name delivers what
    # the sharded queue offered to it, and the sharded queue's consumers take what Java offered to any
    # shard. Java computes the same names (docs/java.md's shardNames, with Redisson's CRC16).
    [options, *_] = python_kinds(java)
    q: DelayedQueue[str] = DelayedQueue(client, f"{qname}-sharded", shards=3, codec="str", **options)
    drop_keys(*QueueKeys.for_name(q.name).all, *(key for keys in q.shard_keys for key in keys.all))
    assert tuple(await jcall(java, "shardNames", queue=q.name, shards=3)) == q.shard_names
    for shards in (2, 6, 64, 1024):
        name = f"{qname}-имя-{shards}"  # the tag as UTF-8 bytes on both sides
        assert tuple(await jcall(java, "shardNames", queue=name, shards=shards)) == \
            DelayedQueue(client, name, shards=shards).shard_names
    items = [f"py-{i}" for i in range(30)]
    await q.offer_many([(item, 0.3) for item in items])  # unkeyed: 10 to each shard, in rotation
    java_got: list[str] = []
    for keys in q.shard_keys:
        java_got += [item for item, _ in await jcall(java, "drain", name=keys.destination, count=10,
                                                     timeout_ms=10_000)]
        await jcall(java, "destroy", name=keys.destination)
    assert sorted(java_got) == sorted(items)
    java_items = {keys.destination: [f"java-{s}-{j}" for j in range(10)] for s, keys in enumerate(q.shard_keys)}
    for name, batch in java_items.items():
        await jcall(java, "offer", name=name, items=batch, delay_ms=300)
        await jcall(java, "destroy", name=name)  # only the sharded queue's transfers move them
    taken: list[str] = []
    async with q:
        while len(taken) < 30:
            taken.extend(await asyncio.wait_for(q.take_many(30), 10))
        assert await q.poll(0.2) is None
    assert sorted(taken) == sorted(item for batch in java_items.values() for item in batch)


@pytest.mark.java
async def test_both_transfers_and_both_consumers_deliver_every_item_exactly_once(
        java: JavaRedisson, make_queue: Any, client: Redis) -> None:
    n = 300
    [options, *_] = python_kinds(java)
    q = make_queue(codec="str", **options)
    await jcall(java, "open", name=q.name)  # Java's transfer task runs
    python_items = [f"py-{i}" for i in range(n)]
    java_items = [f"java-{i}" for i in range(n)]
    python_got: list[str] = []
    async with q:  # aiodelayq's transfer runs too
        await q.offer_many([(item, 0.3 + (i % 50) * 0.02) for i, item in enumerate(python_items)])
        await jcall(java, "offer", name=q.name, items=java_items, delay_ms=600)
        java_drain = asyncio.ensure_future(jcall(java, "drain", name=q.name, count=2 * n, timeout_ms=5_000))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 5.0
        while loop.time() < deadline:
            python_got.extend(await q.take_many(50, timeout=max(0.0, deadline - loop.time())))
        java_got = [item for item, _ in await java_drain]
    await jcall(java, "destroy", name=q.name)
    everything = python_got + java_got
    assert len(everything) == len(set(everything)), "an item was delivered twice"
    assert sorted(everything) == sorted(python_items + java_items), "an item was lost"
    for key in (q.keys.timeout_set, q.keys.delay_list, q.name):
        assert await client.exists(key) == 0, key


@pytest.mark.java
async def test_java_pending_calls_see_strict_python_items_and_not_fast_ones(java: JavaRedisson,
                                                                               make_queue: Any) -> None:
    strict_options = python_kinds(java)[-1]  # strict (3.52) or legacy (3.20.1): kept in Redisson's list
    q = make_queue(codec="str", **strict_options)
    items = ["a", "b", "c", "d"]
    await q.offer_many([(item, 60) for item in items])
    assert await jcall(java, "size", name=q.name) == 4
    assert await jcall(java, "readAll", name=q.name) == items
    assert await jcall(java, "contains", name=q.name, item="c") is True
    assert await jcall(java, "remove", name=q.name, item="c") is True
    assert await jcall(java, "contains", name=q.name, item="c") is False
    assert await q.size() == 3
    assert not await q.contains("c")
    assert sorted(await q.read_all()) == ["a", "b", "d"]  # equal due ms: in element-byte order
    if java.build.wire_format == "redisson":
        # Fast elements live in the zset only: invisible to Java's list-based calls (documented).
        fast = make_queue(name=f"{q.name}-fast", codec="str")
        await fast.offer_many([(item, 60) for item in items])
        assert await jcall(java, "size", name=fast.name) == 0
        assert await jcall(java, "readAll", name=fast.name) == []
        assert await jcall(java, "contains", name=fast.name, item="a") is False
        assert await jcall(java, "remove", name=fast.name, item="a") is False
        assert await fast.size() == 4
        assert await fast.read_all() == items


@pytest.mark.java
async def test_aiodelayq_pending_calls_work_on_java_items(java: JavaRedisson, make_queue: Any) -> None:
    q = make_queue(codec="str")
    items = ["j1", "j2", "j3"]
    await jcall(java, "offer", name=q.name, items=items, delay_ms=60_000)
    assert await q.size() == 3
    assert sorted(await q.read_all()) == items  # same due ms: zset order is by element bytes
    assert await q.contains("j2")
    assert await q.remove("j2")
    assert not await q.contains("j2")
    assert await jcall(java, "size", name=q.name) == 2  # also gone from Redisson's list
    assert sorted(await jcall(java, "readAll", name=q.name)) == ["j1", "j3"]


@pytest.mark.java
async def test_an_element_in_the_other_format_stays_pending_and_aiodelayq_delivers_it(
        java: JavaRedisson, make_queue: Any, client: Redis, qname: str) -> None:
    for index, options in enumerate(other_kinds(java)):
        q = make_queue(name=f"{qname}-{index}", codec="str", **options)
        await q.offer("other-format", 0.1)
        await jcall(java, "open", name=q.name)
        # Java's transfer runs (on subscribe, then when due) and fails on the element: it stays.
        assert await jcall(java, "poll", name=q.name, timeout_ms=1_500) is None
        assert await client.zcard(q.keys.timeout_set) == 1
        async with q:
            assert await asyncio.wait_for(q.take(), 5) == "other-format"
        assert await client.zcard(q.keys.timeout_set) == 0
        # Without it in the way, Java's own offers flow through Java's transfer again.
        await jcall(java, "offer", name=q.name, items=["java-after"], delay_ms=100)
        assert await jcall(java, "poll", name=q.name, timeout_ms=5_000) == "java-after"
        await jcall(java, "destroy", name=q.name)


@pytest.mark.java
async def test_items_with_headers_and_expiry_pass_through_javas_transfer(
        java: JavaRedisson, make_queue: Any, client: Redis, qname: str) -> None:
    for index, options in enumerate(python_kinds(java)):
        q = make_queue(name=f"{qname}-envelope-{index}", codec="str", **options)
        await jcall(java, "open", name=q.name)  # Java's transfer moves them; aiodelayq's queue is not open
        due = await q.offer("headed", 0.2, headers={"traceparent": "t-1"})
        await q.offer("expiring", 0.2, expires=0.05)
        await q.offer("plain", 0.2)
        await until(lambda due=due: server_past(client, due + 300))
        await until(lambda name=q.name: _destination_holds(client, name, 3), timeout_s=10)
        assert await client.zcard(q.keys.timeout_set) == 0  # Java's transfer took all three, verbatim
        await jcall(java, "destroy", name=q.name)
        async with q:
            got = [await asyncio.wait_for(q.take_with_headers(), 5) for _ in range(2)]
        # (in either order: two items due in the same ms are moved in the order of their elements' ids)
        assert sorted(got) == [("headed", {"traceparent": "t-1"}), ("plain", {})], options
        [letter] = await q.dead_letters()
        assert (letter.value, letter.reason) == ("expiring", "expired"), options
        # What a Java consumer sees of an item with headers: the envelope around the payload (its
        # first byte, 0xC1, is not UTF-8: StringCodec reads U+FFFD).
        await jcall(java, "open", name=q.name)
        await q.offer("for-java", 0.05, headers={"h": "v"})
        [(seen, _)] = await jcall(java, "drain", name=q.name, count=1, timeout_ms=5_000)
        assert seen.startswith("\ufffdadq\x04"), seen
        assert seen.endswith("for-java"), seen
        await jcall(java, "destroy", name=q.name)


async def _destination_holds(client: Redis, name: str, n: int) -> bool:
    return int(await client.llen(name)) == n


@pytest.mark.java
async def test_a_recurring_item_goes_on_when_javas_transfer_moves_its_occurrences(
        java: JavaRedisson, make_queue: Any, client: Redis, qname: str) -> None:
    q = make_queue(name=f"{qname}-recurring", codec="str")
    await jcall(java, "open", name=q.name)  # Java's transfer moves the occurrence; aiodelayq's queue is not open
    first = await q.schedule("beat", "b", every=0.2)
    await until(lambda: server_past(client, first + 100))
    if java.build.wire_format == "redisson-legacy":
        # Occurrences are fast elements, which Redisson 3.20's transfer cannot read: it leaves them
        # pending, unharmed, for aiodelayq's transfer.
        await asyncio.sleep(0.5)
        assert await q.get("beat") is not None
    else:
        await until(lambda name=q.name: _destination_holds(client, name, 1), timeout_s=10)
        assert await q.get("beat") is None  # moved: ready, not pending
    await jcall(java, "destroy", name=q.name)
    async with q:
        assert await asyncio.wait_for(q.take(), 5) == "b"
        nxt = await q.get("beat")  # handing it out scheduled the next one
        assert nxt is not None
        assert nxt.recurring
    assert await q.cancel("beat")


def test_the_java_shard_names_in_the_docs_are_the_driver_s() -> None:
    # docs/java.md shows the code the Java tests run (the driver's shardNames, indented as a method).
    docs = (REPO_ROOT / "docs" / "java.md").read_text(encoding="utf-8")
    shown = docs.split("```java\n")[-1].split("```")[0]
    assert "static List<String> shardNames(" in shown
    driver = DRIVER_SOURCE.read_text(encoding="utf-8")
    assert "".join(f"    {line}\n" if line else "\n" for line in shown.splitlines()) in driver
