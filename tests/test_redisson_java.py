"""Interop with the real Java Redisson (3.52.0: ``Bc0Lc0`` elements; 3.20.1: legacy ``dLc0``), one JVM per
build for this module (``tests/redisson_java.py``). Payloads are strings on both sides (Redisson's
``StringCodec``, aiodelayq's ``"str"`` codec). Marked ``java``: they run on one server kind."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest
from redis.asyncio import Redis

from tests.conftest import ServerInfo
from tests.redisson_java import BUILDS, Build, JavaRedisson, compile_driver, unavailable

pytestmark = pytest.mark.java

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
