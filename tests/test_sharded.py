"""A queue larger than one shard: ``DelayedQueue(client, name, shards=K)`` is K ordinary queues in
different slots. Items spread over the shards (a key always to its own), consumers take from all of
them and none starves, whole-queue calls cover every shard, the shard count is fixed, and on a
3-primary cluster nothing is lost or doubled through two consumers, a slot migration or a failover,
while the server time per item does not grow with K.

The tests that take a ``sharded`` fixture run on the session server and (marked ``topology``) on the
shared 3-primary cluster; those that break a cluster run on one of their own."""

from __future__ import annotations

import asyncio
import collections
import random
import statistics
import uuid
import zlib
from collections.abc import AsyncIterator, Callable
from fractions import Fraction
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.crc import key_slot

from aiodelayq import (
    ConfigurationError,
    DelayedQueue,
    InvalidKeyError,
    InvalidNameError,
    QueueClosedError,
    QueueCounts,
    QueueFullError,
    QueueKeys,
    ShardCountError,
)
from aiodelayq._redis.acl import minimal_acl_rules
from aiodelayq.testing import ThrowawayCluster, server_version
from aiodelayq.testing.topologies import _cmd
from tests.faults import debug_args
from tests.helpers import FailoverLoad, migrate_under_load, until

Make = Callable[..., DelayedQueue[Any]]


def _name(label: str) -> str:
    return f"aiodelayq-test:{label}:{uuid.uuid4().hex[:10]}"


def _shard(key: str, shards: int) -> int:
    """The documented rule: zlib's CRC-32 of the key's UTF-8 bytes, modulo the shard count."""
    return zlib.crc32(key.encode()) % shards


def _spaced_names(name: str, shards: int) -> list[str]:
    """The documented placement: shard i is ``{name~n}:i``, n the least integer whose tag ``name~n``
    hashes (CRC16, redis-py's ``key_slot``) into the middle half of the i-th of K equal slot ranges."""
    found: dict[int, str] = {}
    salt = 0
    while len(found) < shards:
        slot = key_slot(f"{name}~{salt}".encode())
        index = slot * shards // 16384
        if Fraction(4 * index + 1, 4 * shards) * 16384 <= slot < Fraction(4 * index + 3, 4 * shards) * 16384:
            found.setdefault(index, f"{{{name}~{salt}}}:{index}")
        salt += 1
    return [found[index] for index in range(shards)]


def _keys_for(shard: int, shards: int, n: int, prefix: str = "k") -> list[str]:
    """``n`` keys that go to ``shard``."""
    found: list[str] = []
    i = 0
    while len(found) < n:
        key = f"{prefix}{i}"
        if _shard(key, shards) == shard:
            found.append(key)
        i += 1
    return found


async def _pending_per_shard(r: Any, q: DelayedQueue[Any]) -> list[int]:
    return [int(await r.zcard(keys.timeout_set)) for keys in q.shard_keys]


class Queues:
    """Sharded queues on one client, closed after the test (their keys dropped on the session server)."""

    def __init__(self, client: Any, drop: Callable[..., None] | None) -> None:
        self.client = client
        self._drop = drop
        self.made: list[DelayedQueue[Any]] = []

    def __call__(self, shards: int = 3, name: str | None = None, **options: Any) -> DelayedQueue[Any]:
        q: DelayedQueue[Any] = DelayedQueue(self.client, name or _name("sharded"), shards=shards, **options)
        self.made.append(q)
        if self._drop is not None:
            self._drop(*QueueKeys.for_name(q.name).all, *(key for keys in q.shard_keys for key in keys.all))
        return q

    def drop(self, *names: str) -> None:
        """Drop the keys of these queue names after the test (on the session server)."""
        if self._drop is not None:
            self._drop(*(key for name in names for key in QueueKeys.for_name(name).all))

    async def aclose(self) -> None:
        results = await asyncio.gather(*(q.aclose() for q in self.made), return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                raise result


@pytest.fixture(params=["server", pytest.param("cluster", marks=pytest.mark.topology)])
async def sharded(request: pytest.FixtureRequest, client: Redis, drop_keys: Callable[..., None],
                  cluster_clients: Any) -> AsyncIterator[Queues]:
    """``sharded(shards=3, name=None, **options)``: a sharded queue on the session server, or on the
    shared 3-primary cluster (a ``RedisCluster`` client); closed after the test."""
    if request.param == "server":
        queues = Queues(client, drop_keys)
    else:
        cl: ThrowawayCluster = request.getfixturevalue("cluster")  # started by the first test that asks
        queues = Queues(cluster_clients(cl), None)
    try:
        yield queues
    finally:
        await queues.aclose()


# -- where items go ---------------------------------------------------------------------------------


async def test_items_spread_evenly_over_the_shards_and_each_is_taken_once(sharded: Queues) -> None:
    q = sharded(shards=6)
    assert q.shards == 6
    assert list(q.shard_names) == _spaced_names(q.name, 6)
    assert q.shard_names == tuple(keys.destination for keys in q.shard_keys)
    assert "shards=6" in repr(q)
    # Unkeyed: in rotation, so exactly even; keyed: by the key's CRC-32, within 25% of even.
    await q.offer_many([(i, 0.05) for i in range(600)])
    assert await _pending_per_shard(sharded.client, q) == [100] * 6
    keyed = [f"order-{i}" for i in range(1200)]
    await q.offer_many([(1000 + i, 0.05) for i in range(1200)], keys=keyed)
    per_shard = [n - 100 for n in await _pending_per_shard(sharded.client, q)]
    assert sum(per_shard) == 1200
    assert all(150 <= n <= 250 for n in per_shard), per_shard
    assert per_shard == [collections.Counter(_shard(k, 6) for k in keyed)[i] for i in range(6)]
    async with q:
        got: list[int] = []
        while len(got) < 1800:
            batch = await q.take_many(200, timeout=5)
            assert batch, f"nothing within 5 s after {len(got)} items"
            got += batch
    assert sorted(got) == list(range(600)) + list(range(1000, 2200))


@pytest.mark.topology
async def test_the_shards_spread_evenly_over_the_primaries_of_a_three_primary_cluster(
        cluster: ThrowawayCluster, cluster_clients: Any) -> None:
    # The shards take evenly spaced slots, so with the default slot map (each primary one contiguous
    # third) and K a multiple of 3, each primary holds K/3 shards, hence a third of the items,
    # whatever the name. Counted by each primary itself: the items in the timeout zsets it holds.
    rc = cluster_clients(cluster)
    measured: list[str] = []
    for k in (3, 6, 6, 6, 12):
        q: DelayedQueue[int] = DelayedQueue(rc, _name("spread"), shards=k)
        try:
            await q.offer_many([(i, 60) for i in range(20 * k)])  # unkeyed: 20 to each shard, in rotation
            per_node = [_items_on(primary.port, q.name) for primary in cluster.primaries()]
            measured.append(f"shards={k}: {per_node}")
            assert per_node == [20 * k // 3] * 3, measured
            assert len({cluster.slot_of(name) for name in q.shard_names}) == k
        finally:
            await q.clear()
            await q.aclose()
    print("\nitems per primary: " + "; ".join(measured))


def _items_on(port: int, name: str) -> int:
    """The pending items of the sharded queue ``name`` that the node on ``port`` holds (``SCAN`` of
    its own keys: the timeout zsets of the shards in its slots)."""
    cursor, total = b"0", 0
    while True:
        # The shards' zsets, however placed ({name~n}:i, or {name:i}).
        cursor, keys = _cmd(port, "SCAN", cursor, "MATCH", f"redisson_delay_queue_timeout:{{{name}[~:]*", "COUNT", 1000)
        total += sum(int(_cmd(port, "ZCARD", key)) for key in keys)
        if cursor in (b"0", 0, "0"):
            return total


async def test_a_keyed_item_lives_on_its_key_shard_for_every_keyed_call(sharded: Queues) -> None:
    q = sharded(shards=4)
    r = sharded.client
    for key in ("order-1", "order-2", "order-3", "émoji-ключ"):
        assert (await q.offer({"key": key}, 60, key=key)).added
        home = q.shard_keys[_shard(key, 4)]
        assert await r.hlen(home.key_index) >= 1
        assert not (await q.offer({"dup": key}, 60, key=key)).added  # deduplicated on its shard
        pending = await q.get(key)
        assert pending is not None
        assert pending.value == {"key": key}
        assert await q.reschedule(key, 120) is not None
        assert (await q.offer({"new": key}, 60, key=key, replace=True)).replaced
    assert await q.size() == 4
    assert sum(await _pending_per_shard(r, q)) == 4
    assert await q.cancel("order-2")
    assert await q.get("order-2") is None
    assert not await q.cancel("order-2")
    assert await q.reschedule("order-2", 1) is None
    # offer_many with keys: each to its shard; a key given twice is kept once.
    dues = await q.offer_many([("a", 60), ("b", 60), ("c", 60)], keys=["many-1", "many-2", "many-1"])
    assert [d.added for d in dues] == [True, True, False]  # type: ignore[attr-defined]
    assert (await q.get("many-1")).value == "a"  # type: ignore[union-attr]
    # A recurring item lives on its key's shard, as its every occurrence.
    await q.schedule("tick", "t", every=0.05)
    home = q.shard_keys[_shard("tick", 4)]
    assert await r.hlen(home.schedules) == 1
    assert (await q.counts()).recurring == 1
    async with q:
        assert [await asyncio.wait_for(q.take(), 5) for _ in range(3)] == ["t", "t", "t"]
    assert await q.cancel("tick")
    with pytest.raises(InvalidKeyError):
        await q.offer("x", 1, key="")
    with pytest.raises(InvalidKeyError):
        await q.get(42)  # type: ignore[arg-type]


async def test_a_window_lives_on_its_key_shard_and_content_picks_the_shard(sharded: Queues) -> None:
    q = sharded(shards=4, codec="json")
    r = sharded.client
    first = await q.offer("a", 0, key="order-7", dedupe_for=60)
    home = q.shard_keys[_shard("order-7", 4)]
    assert await r.zcard(home.dedupe_windows) == 1
    async with q:
        assert await asyncio.wait_for(q.take(), 5) == "a"
    again = await q.offer("b", 0, key="order-7", dedupe_for=60)
    assert (again.deduplicated, int(again)) == (True, int(first))
    many = await q.offer_many([("c", 60), ("d", 60)], keys=["order-7", "order-8"], dedupe_for=60)
    assert [m.deduplicated for m in many] == [True, False]  # type: ignore[attr-defined]
    content = await q.offer({"hook": 1}, 60, dedupe_by_content=True, dedupe_for=60)
    assert content.key is not None
    assert await r.zcard(q.shard_keys[_shard(content.key, 4)].dedupe_windows) >= 1
    assert (await q.offer({"hook": 1}, 60, dedupe_by_content=True)).deduplicated
    dup = await q.offer_many([({"hook": 1}, 60)], dedupe_by_content=True, dedupe_for=60)
    assert dup[0].deduplicated  # type: ignore[attr-defined]
    assert (await q.counts()).deduplicating == 3


async def test_the_shards_events_merge_by_time_stored_and_followed(sharded: Queues) -> None:
    q = sharded(shards=3, codec="json")
    await q.set_events(1000)
    for shard in q.shard_keys:
        assert await sharded.client.hget(shard.controls, "events") == b"1000"
    keys = [f"order-{i}" for i in range(12)]
    for key in keys:  # one call each: the events' times follow the offers' order
        await q.offer(key, 60, key=key)
    stored = [e async for e in q.events("0", follow=False)]
    assert sorted(e.key for e in stored) == sorted(keys)  # type: ignore[type-var]
    assert [e.at_ms for e in stored] == sorted(e.at_ms for e in stored)
    # The offers' order, where their times differ (within a ms, shards have no order between them).
    rank = {e.key: keys.index(e.key) for e in stored}  # type: ignore[arg-type]
    assert all(rank[a.key] < rank[b.key] for a in stored for b in stored if a.at_ms < b.at_ms)
    assert len({_shard(k, 3) for k in keys}) == 3
    following = q.events()  # from now on
    follow = asyncio.ensure_future(anext(following))
    await asyncio.sleep(0.2)
    assert await q.cancel("order-5")
    event = await asyncio.wait_for(follow, 10)
    assert (event.kind, event.key) == ("cancelled", "order-5")
    await following.aclose()
    await q.set_events(None)
    assert [await sharded.client.exists(s.event_stream) for s in q.shard_keys] == [0, 0, 0]


# -- consumers ---------------------------------------------------------------------------------------


async def test_peek_merges_the_shards_in_due_order(sharded: Queues) -> None:
    q = sharded(shards=3)
    # Due times interleaved over the shards: item i due i seconds from now, in rotation.
    await q.offer_many([(i, 100 + i) for i in range(30)])
    assert sorted(await _pending_per_shard(sharded.client, q)) == [10, 10, 10]
    peeked = await q.peek(12)
    assert [p.value for p in peeked] == list(range(12))
    assert [p.due_ms for p in peeked] == sorted(p.due_ms for p in peeked)
    assert [p.value for p in await q.peek(1000)] == list(range(30))
    with pytest.raises(ConfigurationError, match="limit"):
        await q.peek(0)


async def test_no_shard_starves_take_receive_or_a_worker(sharded: Queues) -> None:
    q = sharded(shards=4)
    for shard in range(4):  # 60 items on every shard, each value naming its shard
        keys = _keys_for(shard, 4, 60, prefix=f"s{shard}-")
        await q.offer_many([(f"{shard}:{i}", 0) for i in range(60)], keys=keys)
    async with q:
        await until(lambda: _ready(q, 240), timeout_s=10)
        # One at a time, the first 16 items come from every shard (the scan starts one shard further
        # each call).
        first = [await asyncio.wait_for(q.take(), 5) for _ in range(16)]
        assert {item.split(":")[0] for item in first} == {"0", "1", "2", "3"}, first
        messages = [await q.receive(30, timeout=5) for _ in range(16)]
        assert all(m is not None for m in messages)
        assert {m.value.split(":")[0] for m in messages if m is not None} == {"0", "1", "2", "3"}
        for m in messages:
            assert m is not None
            assert await m.ack()
        # A worker drains the rest, from every shard, acking each message on its own shard.
        handled: list[str] = []

        async def handle(item: str) -> None:
            handled.append(item)

        worker = q.worker(handle, concurrency=4)
        running = asyncio.create_task(worker.run())
        await until(lambda: len(handled) >= 240 - 32, timeout_s=20)
        worker.stop()
        await asyncio.wait_for(running, 10)
        everything = first + [m.value for m in messages if m is not None] + handled
        assert sorted(everything) == sorted(f"{s}:{i}" for s in range(4) for i in range(60))
        await until(lambda: _in_flight(sharded.client, q, 0), timeout_s=10)  # every ack reached its shard


async def _ready(q: DelayedQueue[Any], n: int) -> bool:
    return await q.ready_size() == n


async def _in_flight(r: Any, q: DelayedQueue[Any], n: int) -> bool:
    return sum([int(await r.zcard(keys.in_flight)) for keys in q.shard_keys]) == n


async def test_a_waiting_consumer_gets_an_item_of_any_shard_and_closing_ends_the_waits(sharded: Queues) -> None:
    q = sharded(shards=3)
    async with q:
        # Every shard idle: the waits wake on whichever shard an item falls due on.
        for key in ("a", "b", "c", "d", "e", "f"):
            taking = asyncio.create_task(q.take())
            await asyncio.sleep(0.05)
            await q.offer(f"take-{key}", 0.1, key=key)
            assert await asyncio.wait_for(taking, 5) == f"take-{key}"
            receiving = asyncio.create_task(q.receive(30, timeout=10))
            await asyncio.sleep(0.05)
            await q.offer(f"receive-{key}", 0.1, key=key)
            message = await asyncio.wait_for(receiving, 5)
            assert message is not None
            assert message.value == f"receive-{key}"
            assert await message.ack()
        assert await q.poll() is None
        assert await q.take_many(10, timeout=0.2) == []
        assert await q.receive(30, timeout=0.2) is None
        waiting = [asyncio.create_task(q.take()), asyncio.create_task(q.receive(30))]
        iterating = asyncio.create_task(_drain_iterator(q))
        await asyncio.sleep(0.1)
    for wait in waiting:
        with pytest.raises(QueueClosedError):
            await asyncio.wait_for(wait, 5)
    assert await asyncio.wait_for(iterating, 5) == []
    assert not q.is_open
    await q.aclose()  # idempotent


async def _drain_iterator(q: DelayedQueue[Any]) -> list[Any]:
    return [item async for item in q]


async def test_cancelled_takes_and_receives_lose_and_double_nothing(sharded: Queues) -> None:
    q = sharded(shards=3)
    rng = random.Random(11)
    got: list[int] = []
    await q.offer_many([(i, 0.002 * (i % 50)) for i in range(600)])
    async with q:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 30  # does not hang (about 2 s expected)
        while len(got) < 600 and loop.time() < deadline:
            # Waves of callers, each cancelled at a random moment: waiting, popping, or done.
            calls = [asyncio.create_task(q.take_many(rng.randint(1, 20))) for _ in range(4)]
            calls += [asyncio.create_task(q.receive_many(rng.randint(1, 20), 30)) for _ in range(4)]
            await asyncio.sleep(rng.uniform(0, 0.01))
            for call in calls:
                call.cancel()
            for result in await asyncio.gather(*calls, return_exceptions=True):
                if isinstance(result, asyncio.CancelledError):
                    continue
                assert isinstance(result, list), result
                for entry in result:
                    if isinstance(entry, int):
                        got.append(entry)
                    else:
                        got.append(entry.value)
                        assert await entry.ack()
    assert sorted(got) == list(range(600))


async def test_exactly_once_under_two_consumers(sharded: Queues) -> None:
    name = _name("two")
    producer = sharded(shards=3, name=name)
    taker = sharded(shards=3, name=name)
    receiver = sharded(shards=3, name=name)
    taken: list[int] = []
    received: list[int] = []
    stop = asyncio.Event()

    async def take() -> None:
        while not stop.is_set():
            taken.extend(await taker.take_many(7, timeout=0.2))

    async def receive() -> None:
        while not stop.is_set():
            for m in await receiver.receive_many(5, 30, timeout=0.2):
                received.append(m.value)
                assert await m.ack()

    async with taker, receiver:
        consumers = [asyncio.create_task(take()), asyncio.create_task(receive())]
        for start in range(0, 1500, 100):
            await producer.offer_many([(i, 0.01 * (i % 7)) for i in range(start, start + 100)])
        await until(lambda: len(taken) + len(received) >= 1500, timeout_s=30)
        stop.set()
        await asyncio.wait_for(asyncio.gather(*consumers), 10)
    assert sorted(taken + received) == list(range(1500))
    assert taken, "the taker took part"
    assert received, "the receiver took part"
    assert await producer.counts() == QueueCounts(0, 0, 0, 0, None)


# -- whole-queue calls -------------------------------------------------------------------------------


async def test_whole_queue_calls_cover_every_shard(sharded: Queues) -> None:
    q = sharded(shards=3, max_deliveries=2)
    r = sharded.client
    await q.offer_many([(f"p{i}", 60) for i in range(9)])
    await q.offer_many([(f"r{i}", 0) for i in range(6)])  # due, pending until a consumer opens the queue
    assert (await q.size(), await q.ready_size()) == (15, 0)
    assert await q.contains("p4")
    assert not await q.contains("nope")
    assert sorted(await q.read_all()) == sorted([f"p{i}" for i in range(9)] + [f"r{i}" for i in range(6)])
    assert await q.remove("p4")
    assert not await q.remove("p4")
    assert await q.remove_all(["p1", "p2", "nope"])
    assert sorted(v for v in await q.read_all() if v.startswith("p")) == ["p0", "p3", "p5", "p6", "p7", "p8"]
    # pause and resume reach every shard; counts read them all.
    await q.pause()
    assert await q.is_paused()
    assert all([await r.hget(keys.controls, "paused") is not None for keys in q.shard_keys])
    assert (await q.counts()).paused
    await q.resume()
    assert not await q.is_paused()
    # A whole-queue rate: a third on each shard; counts show the whole.
    await q.set_rate_limit(30, burst=9)
    assert [float(await r.hget(keys.controls, "rate")) for keys in q.shard_keys] == [10.0] * 3
    assert [int(await r.hget(keys.controls, "burst")) for keys in q.shard_keys] == [3] * 3
    counts = await q.counts()
    assert (counts.rate_limit_per_s, counts.rate_burst) == (30.0, 9)
    with pytest.raises(ConfigurationError, match="per_second"):
        await q.set_rate_limit(0)
    await q.set_rate_limit(None)
    assert (await q.counts()).rate_limit_per_s is None
    # A whole-queue concurrency limit: 10 over 3 shards is 4, 3, 3; counts show the whole.
    await q.set_concurrency_limit(10)
    assert [int(await r.hget(keys.controls, "cap")) for keys in q.shard_keys] == [4, 3, 3]
    assert (await q.counts()).concurrency_limit == 10
    with pytest.raises(ConfigurationError, match="limit"):
        await q.set_concurrency_limit(2)  # below the shard count: a shard would hand nothing out
    await q.set_concurrency_limit(None)
    assert (await q.counts()).concurrency_limit is None
    # Dead letters: each message dies on its shard; read merged, oldest first; requeued and purged on all.
    async with q:
        await until(lambda: _ready(q, 6), timeout_s=10)
        for _ in range(6):
            m = await q.receive(30, timeout=5)
            assert m is not None
            assert await m.nack(dead_letter=True)
            await asyncio.sleep(0.002)  # distinct death times
    letters = await q.dead_letters()
    assert len(letters) == 6
    assert [d.dead_at_ms for d in letters] == sorted(d.dead_at_ms or 0 for d in letters)
    assert sum([int(await r.llen(keys.dead_letter)) for keys in q.shard_keys]) == 6
    oldest = [d.value for d in await q.dead_letters(limit=2)]
    assert oldest == [d.value for d in letters[:2]]
    assert await q.requeue_dead_letters(limit=2, delay=60) == 2
    assert sorted(v for v in await q.read_all() if v.startswith("r")) == sorted(oldest)
    assert await q.purge_dead_letters() == 4
    assert await q.dead_letters() == []
    counts = await q.counts()
    assert (counts.pending, counts.ready, counts.in_flight, counts.dead_letters) == (8, 0, 0, 0)
    await q.clear()
    assert await q.size() == 0


async def test_offer_many_is_one_call_per_shard_and_checked_first(sharded: Queues) -> None:
    q = sharded(shards=3)
    # A bad item anywhere writes nothing on any shard.
    with pytest.raises(InvalidKeyError):
        await q.offer_many([(1, 60), (2, 60), (3, 60)], keys=["a", "b", ""])
    with pytest.raises(Exception, match="delay"):
        await q.offer_many([(1, 60), (2, -1)])
    assert await _pending_per_shard(sharded.client, q) == [0, 0, 0]
    dues = await q.offer_many([(i, 60) for i in range(9)])
    assert len(dues) == 9
    assert await _pending_per_shard(sharded.client, q) == [3, 3, 3]
    if not isinstance(sharded.client, RedisCluster):
        before = await _script_calls(sharded.client)
        await q.offer_many([(i, 60) for i in range(30)])
        assert await _script_calls(sharded.client) - before == 3  # one OFFER per shard


async def _script_calls(r: Redis) -> int:
    return int((await r.info("commandstats"))["cmdstat_evalsha"]["calls"])


async def test_max_pending_is_split_over_the_shards(sharded: Queues) -> None:
    q = sharded(shards=2, capacity=4)  # two items per shard
    keys = _keys_for(0, 2, 3)
    await q.offer("a", 60, key=keys[0])
    await q.offer("b", 60, key=keys[1])
    with pytest.raises(QueueFullError):
        await q.offer("c", 60, key=keys[2])
    await q.offer_many([("d", 60), ("e", 60)], keys=_keys_for(1, 2, 2))
    assert await q.size() == 4


# -- the shard count ---------------------------------------------------------------------------------


async def test_the_shard_count_is_fixed_and_a_different_one_refused(sharded: Queues) -> None:
    r = sharded.client
    name = _name("count")
    q = sharded(shards=3, name=name)
    await q.offer(1, 60)
    assert await r.hget(QueueKeys.for_name(q.name).controls, "shards") == b"3 spaced"
    for other in (2, 4, 1):
        wrong: DelayedQueue[Any] = DelayedQueue(r, name, shards=other)
        with pytest.raises(ShardCountError) as caught:
            await wrong.offer(2, 60)
        assert (caught.value.recorded, caught.value.wanted) == (3, other)
        assert "shards=3" in str(caught.value)
        with pytest.raises(ShardCountError):  # every call, not only the first (an ordinary object: its
            await (wrong.size() if other > 1 else wrong.offer(3, 60))  # offers and its opening)
        with pytest.raises(ShardCountError):
            await wrong.open()
        assert isinstance(caught.value, ConfigurationError)
    assert await q.size() == 1  # nothing of theirs was written
    assert await r.zcard(QueueKeys.for_name(q.name).timeout_set) == 0  # and nothing under the name itself
    # The same count again is fine (another process, or a restart).
    again = sharded(shards=3, name=name)
    assert await again.size() == 1
    # A name that holds an ordinary queue cannot become a sharded one.
    plain_name = _name("plain")
    plain = sharded(shards=3, name=plain_name)  # registers the keys for cleanup
    await DelayedQueue(r, plain_name).offer(1, 60)
    with pytest.raises(ShardCountError) as caught:
        await plain.offer(2, 60)
    assert (caught.value.recorded, caught.value.wanted) == (1, 3)
    assert "ordinary" in str(caught.value)
    # Two new queue objects racing with different counts on a fresh name: exactly one wins.
    race = _name("race")
    racers = [sharded(shards=k, name=race) for k in (2, 3, 5)]
    results = await asyncio.gather(*(racer.offer(0, 60) for racer in racers), return_exceptions=True)
    assert sum(not isinstance(result, BaseException) for result in results) == 1, results
    assert all(isinstance(result, (int, ShardCountError)) for result in results)


async def test_a_name_recorded_with_shards_placed_by_their_names_keeps_them(sharded: Queues) -> None:
    # A record of the count alone ("3") places shard i at the ordinary queue {name:i}. An object
    # makes its shards as a new name's (spaced), and at its first call places them as recorded,
    # before any call reaches a shard: what is pending, ready or keyed there is all found, and new
    # items go there too.
    r = sharded.client
    name = _name("hashed")
    hashed = [f"{{{name}:{i}}}" for i in range(3)]
    sharded.drop(name, *hashed)
    await r.hset(QueueKeys.for_name(name).controls, "shards", "3")
    keys = [_keys_for(i, 3, 1, prefix=f"key{i}-")[0] for i in range(3)]
    for i, shard_name in enumerate(hashed):
        shard: DelayedQueue[str] = DelayedQueue(r, shard_name)
        await shard.offer(f"due-{i}", 0.05)
        await shard.offer(f"keyed-{i}", 60, key=keys[i])
    q = sharded(shards=3, name=name)
    assert list(q.shard_names) == _spaced_names(name, 3)  # a new name's, until its first call
    # Two first calls at once: both wait for the check, which places the shards before either goes on.
    counted, _ = await asyncio.gather(q.size(), q.offer("new", 0.05))
    assert counted in (6, 7)
    assert list(q.shard_names) == hashed
    assert [keys.destination for keys in q.shard_keys] == hashed
    assert await q.size() == 7
    assert [(await q.get(key)).value for key in keys] == ["keyed-0", "keyed-1", "keyed-2"]  # type: ignore[union-attr]
    assert await q.cancel(keys[1])
    async with q:
        got = [await asyncio.wait_for(q.take(), 5) for _ in range(4)]
    assert sorted(got) == ["due-0", "due-1", "due-2", "new"]
    assert await q.size() == 2
    assert await r.hget(QueueKeys.for_name(q.name).controls, "shards") == b"3"  # the record stays as it was
    for spaced in _spaced_names(name, 3):  # and nothing went where a new name's shards would be
        assert not await r.exists(QueueKeys.for_name(spaced).timeout_set)
    # An opening checks first too: a second object (another process) consumes the same shards.
    other = sharded(shards=3, name=name)
    async with other:
        await q.offer("to the other", 0.05)
        assert await asyncio.wait_for(other.take(), 5) == "to the other"
    assert list(other.shard_names) == hashed


async def test_a_record_this_release_cannot_read_is_refused(sharded: Queues) -> None:
    name = _name("unknown")
    await sharded.client.hset(QueueKeys.for_name(name).controls, "shards", "3 elsewhere")
    q = sharded(shards=3, name=name)
    for call in (q.size, q.open):
        with pytest.raises(ShardCountError, match="cannot read") as caught:
            await call()
        assert "'3 elsewhere'" in str(caught.value)
    assert await sharded.client.hget(QueueKeys.for_name(q.name).controls, "shards") == b"3 elsewhere"


@pytest.mark.waits
async def test_tiered_pending_works_per_shard(sharded: Queues) -> None:
    # Each shard tiers its own far items (its buckets in its own slot); the whole-queue calls and
    # the consumers see them, each delivered once.
    q = sharded(shards=3, codec="str", tier_after_s=1.0)
    r = sharded.client
    try:
        await q.offer_many([(f"far{i}", 2.5 + 0.05 * i) for i in range(30)])
        tiered = [int(await r.get(keys.tier_count) or 0) for keys in q.shard_keys]
        assert tiered == [10, 10, 10]
        assert await q.size() == 30
        assert (await q.counts()).tiered == 30
        assert len(await q.peek(30)) == 30
        async with q:
            got = [await asyncio.wait_for(q.take(), 20) for _ in range(30)]
            assert await q.poll(0.3) is None
        assert sorted(got) == sorted(f"far{i}" for i in range(30))
        assert (await q.counts()).tiered == 0
        # A name whose ordinary queue holds only tiered items is an ordinary queue's: not sharded.
        name = _name("tiered-plain")
        plain = DelayedQueue(r, name, codec="str", tier_after_s=1.0)
        await plain.offer("far", 3600)
        assert await r.zcard(plain.keys.timeout_set) == 0
        with pytest.raises(ShardCountError):
            await sharded(shards=3, name=name).offer("x", 60)
        await plain.clear()
    finally:
        await q.clear()


def test_bad_shard_options_are_refused_by_name(client: Redis) -> None:
    for bad in (0, -1, True, 2.0, "3", 1025):
        with pytest.raises(ConfigurationError, match="shards"):
            DelayedQueue(client, "orders", shards=bad)  # type: ignore[arg-type]
    for braced in ("{orders}", "orders}", "a}b"):  # a '}' alone gives every shard's keys one tag too
        # (on a cluster client, a name whose own keys span slots is refused for that first)
        with pytest.raises(InvalidNameError, match=r"sharded|hash to one slot"):
            DelayedQueue(client, braced, shards=2)
    assert DelayedQueue(client, "{orders}").shards == 1  # an ordinary queue may have a hash tag
    assert "shards" not in repr(DelayedQueue(client, "orders"))


async def test_a_shard_is_an_ordinary_queue_others_may_use(sharded: Queues) -> None:
    q = sharded(shards=2)
    key = _keys_for(1, 2, 1)[0]
    await q.offer("from the sharded queue", 0.05, key=key)
    # A consumer of one shard (Java's RDelayedQueue on "{name:1}" sees the same) gets it.
    shard: DelayedQueue[str] = DelayedQueue(sharded.client, q.shard_keys[1].destination)
    sharded.made.append(shard)
    async with shard:
        assert await asyncio.wait_for(shard.take(), 5) == "from the sharded queue"
        await shard.offer("to the shard", 0.05)
    async with q:
        assert await asyncio.wait_for(q.take(), 5) == "to the shard"


async def test_a_sharded_queue_works_as_its_minimal_acl_user(acl_client: Any, redis_server: Any) -> None:
    version = tuple(int(x) for x in server_version(redis_server.kind.binary).split(".")[:2])
    rules = ["on", ">secret", *minimal_acl_rules("orders", waitaof=version >= (7, 2), shards=3)]
    client = await acl_client("sharded-user", "secret", rules)
    q: DelayedQueue[Any] = DelayedQueue(client, "orders", shards=3, max_deliveries=2)
    try:
        await q.offer_many([(i, 0.05) for i in range(12)])
        await q.offer("keyed", 60, key="k")
        assert (await q.get("k")).value == "keyed"  # type: ignore[union-attr]
        assert await q.reschedule("k", 120) is not None
        assert len(await q.peek(20)) == 13
        async with q:
            got = [await asyncio.wait_for(q.take(), 5) for _ in range(6)]
            while len(got) < 12:
                m = await q.receive(30, timeout=5)
                assert m is not None
                got.append(m.value)
                assert await m.ack(confirm=True)
            assert sorted(got) == list(range(12))
            await q.pause()
            assert await q.is_paused()
            await q.resume()
            await q.set_rate_limit(30)
            await q.set_rate_limit(None)
            await q.offer("dead", 0)
            m = await q.receive(30, timeout=5)
            assert m is not None
            assert await m.nack(dead_letter=True)
            assert [d.value for d in await q.dead_letters()] == ["dead"]
            assert await q.requeue_dead_letters() == 1
            m = await q.receive(30, timeout=5)
            assert m is not None
            assert await m.ack(confirm=True)
            assert await q.purge_dead_letters() == 0
        assert await q.cancel("k")
        assert await q.contains("nope") is False
        assert await q.read_all() == []
        await q.clear()
        counts = await q.counts()
        assert (counts.pending, counts.ready, counts.in_flight, counts.dead_letters) == (0, 0, 0, 0)
        with pytest.raises(ShardCountError):
            await DelayedQueue(client, "orders").offer(1, 60)  # OFFER's HGET of the count is allowed too
    finally:
        await q.aclose()


async def test_a_queue_recorded_with_shards_placed_by_their_names_works_as_its_minimal_acl_user(
        acl_client: Any, redis_server: Any) -> None:
    version = tuple(int(x) for x in server_version(redis_server.kind.binary).split(".")[:2])
    rules = ["on", ">secret", *minimal_acl_rules("orders", waitaof=version >= (7, 2), shards=3, placement="hashed")]
    client = await acl_client("hashed-user", "secret", rules)
    await client.hset(QueueKeys.for_name("orders").controls, "shards", "3")  # as the record is found
    q: DelayedQueue[Any] = DelayedQueue(client, "orders", shards=3)
    try:
        await q.offer_many([(i, 0.05) for i in range(6)])
        assert q.shard_names == ("{orders:0}", "{orders:1}", "{orders:2}")
        async with q:
            assert sorted([await asyncio.wait_for(q.take(), 5) for _ in range(6)]) == list(range(6))
    finally:
        await q.aclose()


# -- on a cluster: migrations, failovers, and what an item costs -------------------------------------


@pytest.mark.topology
async def test_a_slot_migration_under_load_loses_and_doubles_nothing(own_cluster: Callable[..., ThrowawayCluster],
                                                                     cluster_clients: Any) -> None:
    cl = own_cluster()
    rc = cluster_clients(cl)
    q: DelayedQueue[int] = DelayedQueue(rc, _name("migrate"), shards=3)
    slot = cl.slot_of(q.shard_keys[0].destination)
    source = cl.primary_of_slot(slot)
    target = next(n for n in cl.primaries() if n.port != source.port)
    async with q:
        offered, got, moved = await migrate_under_load(q, lambda: cl.migrate_slot(slot, target, pause_s=0.2),
                                                       warm=30, pause_s=0.003)
    assert moved >= 2, "the shard's keys should move one by one"
    assert cl.primary_of(q.shard_keys[0].destination).port == target.port
    assert sorted(got) == offered, (len(got), len(offered))
    assert {i % 3 for i in offered} == {0, 1, 2}


@pytest.mark.topology
async def test_a_killed_primary_loses_no_confirmed_offer_and_no_reliable_message(
        own_cluster: Callable[..., ThrowawayCluster], cluster_clients: Any, redis_server: Any) -> None:
    # As test_cluster.py's failover test, with the queue's shards over the primaries: the shards on
    # the other primaries go on, the killed one's fail over; nothing confirmed is lost.
    cl = own_cluster(replicas=2, extra_args=debug_args(redis_server.kind))
    rc = cluster_clients(cl)
    q: DelayedQueue[int] = DelayedQueue(rc, _name("failover"), shards=3, min_replicas=1, replication_timeout_s=1.0,
                                        call_timeout_s=10.0)
    primary = cl.primary_of(q.shard_keys[0].destination)
    async with q, FailoverLoad(q) as load:
        print("\n" + await load.kill_unreplicated_primary(cl, primary, warm=30, label="sharded cluster"))
    assert load.lost == [], f"{len(load.lost)} confirmed offers lost: {load.lost[:20]}"
    assert len(load.confirmed) >= 60
    assert cl.primary_of(q.shard_keys[0].destination).port != primary.port


# What the measurement changes on the primaries: every command logged, with room for all of them,
# and every zset a skiplist (see the test).
_MEASURING = {"slowlog-max-len": "1000000", "zset-max-ziplist-entries": "0", "slowlog-log-slower-than": "0"}


def _slowlog_on(cl: ThrowawayCluster) -> dict[int, dict[str, bytes]]:
    """Start logging every command of the primaries; returns their settings, to restore."""
    saved = {}
    for node in cl.primaries():
        saved[node.port] = {name: _cmd(node.port, "CONFIG", "GET", name)[name.encode()] for name in _MEASURING}
        _cmd(node.port, "SLOWLOG", "RESET")
        for name, value in _MEASURING.items():
            _cmd(node.port, "CONFIG", "SET", name, value)
    return saved


def _slowlog_off(cl: ThrowawayCluster, saved: dict[int, dict[str, bytes]], names: list[str]) -> dict[str, int]:
    """Restore the settings; the server time (µs) of the commands naming each of ``names`` (a key of
    its queue among their first arguments), summed over the primaries."""
    usec = dict.fromkeys(names, 0)
    for node in cl.primaries():
        _cmd(node.port, "CONFIG", "SET", "slowlog-log-slower-than", saved[node.port]["slowlog-log-slower-than"])
        for entry in _cmd(node.port, "SLOWLOG", "GET", "1000000"):
            duration, args = int(entry[2]), entry[3]
            for name in names:
                if any(name.encode() in arg for arg in args[:6]):
                    usec[name] += duration
                    break
        for setting, value in saved[node.port].items():
            _cmd(node.port, "CONFIG", "SET", setting, value)
    return usec


async def _offer_and_consume(q: DelayedQueue[int], items: int, mode: str, batch_size: int) -> None:
    """Offer ``items`` in one offer_many, then take them (``take``), or receive and ack them, in
    batches of ``batch_size``; then close ``q`` (an open queue)."""
    async with q:
        await q.offer_many([(i, 0) for i in range(items)])
        # Every item in its list first, moved by the transfer task, so both queues pop from their
        # lists: takers that drain a backlog move what they pop and skip the list's hop, which a
        # shard of 500 items (one batch) never has to do.
        await until(lambda: _ready(q, items), timeout_s=30)
        got = 0
        while got < items:
            if mode == "take":
                batch: list[Any] = await q.take_many(batch_size, timeout=5)
            else:
                batch = await q.receive_many(batch_size, 30, timeout=5)
                for m in batch:
                    await m.ack()
            assert batch, f"nothing within 5 s after {got} items"
            got += len(batch)
    # closed: the acks written behind have landed


@pytest.mark.topology
async def test_the_server_time_per_item_does_not_grow_with_the_shard_count(
        own_cluster: Callable[..., ThrowawayCluster], cluster_clients: Any) -> None:
    # The same items through a queue of 1 shard and one of 6, at the same time, so both see the same
    # machine: the server's time per command (SLOWLOG at threshold 0: the clock INFO commandstats
    # sums) is given to each queue by its key names and summed over the primaries. On 2 shared cores
    # a node descheduled in the middle of a command adds milliseconds to that command's clock, and a
    # queue's time per item spans 2x from run to run; the two queues of one run share the machine,
    # so each run gives one ratio, and the median of nine runs counts. The cluster has no replicas:
    # three replicas applying the stream on the same 2 cores inflate the clock of the queue whose
    # commands run on three nodes at once (the sharded one) more than the other's.
    # What is compared is the work per item, so a call's fixed cost must not weigh more in one queue
    # than in the other: the batches are of 600, 100 per shard of the sharded queue (with batches of
    # 100, 17 items per shard's call, the fixed cost of a script call doubled the sharded queue's
    # SETTLE time per item).
    # Every zset is a skiplist meanwhile: what is compared is the library's work per item, not the
    # server's encoding of small zsets (a shard's in-flight set under 128 messages is a listpack,
    # whose inserts cost O(n): with the default encoding, receive + ack measured about 1.3x here).
    cluster = own_cluster(replicas=0)
    rc = cluster_clients(cluster)
    items, batch_size = 6000, 600
    per_item: dict[str, list[tuple[float, float]]] = {"take": [], "receive": []}
    for mode in ("receive", "take") * 9:
        one: DelayedQueue[int] = DelayedQueue(rc, _name("cost-one"), shards=1)
        six: DelayedQueue[int] = DelayedQueue(rc, _name("cost-six"), shards=6)
        # Opened first (the shard count checked and recorded, every shard subscribed and its first
        # transfer done): the cost of opening a shard is not a cost per item.
        await asyncio.gather(one.open(), six.open())
        saved = _slowlog_on(cluster)
        try:
            await asyncio.gather(_offer_and_consume(one, items, mode, batch_size),
                                 _offer_and_consume(six, items, mode, batch_size))
        finally:
            usec = _slowlog_off(cluster, saved, [one.name, six.name])
        per_item[mode].append((usec[one.name] / items, usec[six.name] / items))
    for mode, runs in per_item.items():
        runs_text = ", ".join(f"{a:.1f}/{b:.1f}" for a, b in runs)
        ratio = statistics.median(b / a for a, b in runs)
        print(f"\n{mode}: server µs per item, 1 shard/6 shards: {runs_text}; median ratio x{ratio:.2f}")
        assert ratio < 1.5, (mode, runs)


async def test_a_sharded_queue_names_its_shards_keys_not_its_names(sharded: Queues) -> None:
    q = sharded(shards=3, name=_name("keys"))
    with pytest.raises(ConfigurationError, match="shard_keys"):
        q.keys  # noqa: B018
    assert len(q.shard_keys) == 3


async def test_a_group_lives_in_one_shard_and_keeps_its_order(sharded: Queues) -> None:
    q = sharded(shards=3)
    r = sharded.client
    items = [(f"{g}:{i}", 0) for i in range(10) for g in ("alpha", "beta", "gamma", "delta")]
    await q.offer_many(items, groups=[value.split(":")[0] for value, _ in items])
    for group in ("alpha", "beta", "gamma", "delta"):
        home = q.shard_keys[_shard(group, 3)]
        assert await r.zcard(home.grouped) >= 10
    # A keyed grouped item goes where its group goes; the keyed calls still find it.
    key = next(k for k in ("k1", "k2", "k3", "k4") if _shard(k, 3) != _shard("alpha", 3))
    before = await r.zcard(q.shard_keys[_shard("alpha", 3)].grouped)
    assert (await q.offer("keyed", 3600, key=key, group="alpha")).added
    assert await r.zcard(q.shard_keys[_shard("alpha", 3)].grouped) == before + 1
    pending = await q.get(key)
    assert pending is not None
    assert pending.group == "alpha"
    assert await q.reschedule(key, 7200) is not None
    assert await q.cancel(key)
    assert await q.get(key) is None
    got: list[str] = []
    async with q:
        while len(got) < len(items):
            m = await q.receive(30, timeout=10)
            assert m is not None
            got.append(m.value)
            assert await m.ack()
    for group in ("alpha", "beta", "gamma", "delta"):
        assert [v for v in got if v.startswith(group)] == [f"{group}:{i}" for i in range(10)]
    await q.set_group_concurrency(2)
    assert (await q.counts()).group_concurrency == 2
