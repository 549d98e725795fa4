"""Redis Cluster: the same API on a ``RedisCluster`` client, on a real 3-primary +
3-replica cluster of the session's server kind: queues on every primary, keys, the contents,
dead letters, reliable consumption, Redisson's notifications heard from another node, bounded
connections per node, a slot migration under load, and a primary killed under load."""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import os
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from redis.asyncio.cluster import RedisCluster

from aiodelayq import DelayedQueue
from aiodelayq.testing import ThrowawayCluster
from aiodelayq.testing.topologies import _cmd
from tests.faults import debug_args
from tests.helpers import FailoverLoad, migrate_under_load
from tests.redisson_scripts import OFFER_CURRENT

pytestmark = pytest.mark.topology

Clients = Callable[..., RedisCluster]


def _name(label: str) -> str:
    return f"aiodelayq-test:{label}:{uuid.uuid4().hex[:10]}"


@pytest.mark.smoke
async def test_queues_on_every_primary_deliver(cluster: ThrowawayCluster, cluster_clients: Clients) -> None:
    rc = cluster_clients(cluster)
    # Random names land on only two of the three primaries about once in 40 draws of 12, so pick
    # names until every primary owns four queues: the test is about delivery from every primary,
    # not about how names hash.
    per_primary: dict[int, list[DelayedQueue[int]]] = {}
    for i in range(300):
        q: DelayedQueue[int] = DelayedQueue(rc, _name(f"spread{i}"))
        owned = per_primary.setdefault(cluster.primary_of(q.keys.destination).port, [])
        if len(owned) < 4:
            owned.append(q)
        if len(per_primary) == 3 and all(len(v) == 4 for v in per_primary.values()):
            break
    queues = [q for owned in per_primary.values() for q in owned]
    assert len(queues) == 12, "300 random names should put four queues on each of the three primaries"
    for i, q in enumerate(queues):
        assert len(await q.offer_many([(i * 100 + j, 0.05) for j in range(20)])) == 20
    for i, q in enumerate(queues):
        async with q:
            got = [await asyncio.wait_for(q.take(), 5) for _ in range(20)]
        assert sorted(got) == [i * 100 + j for j in range(20)]


async def test_keys_pending_view_and_dead_letters_on_a_cluster(cluster: ThrowawayCluster,
                                                              cluster_clients: Clients) -> None:
    rc = cluster_clients(cluster)
    q: DelayedQueue[Any] = DelayedQueue(rc, _name("keys"), max_deliveries=1)
    assert (await q.offer("a", 60, key="order-1")).added
    assert not (await q.offer("b", 60, key="order-1")).added
    assert (await q.get("order-1")).value == "a"  # type: ignore[union-attr]
    assert await q.reschedule("order-1", 120) is not None
    assert await q.cancel("order-1")
    assert await q.get("order-1") is None
    await q.offer_many([("x", 60), ("y", 60)])
    assert await q.size() == 2
    assert await q.contains("x")
    assert await q.remove("x")
    assert await q.read_all() == ["y"]
    await q.clear()
    assert await q.size() == 0
    await q.offer("poison", 0)
    async with q:
        msg = await q.receive(30, timeout=5)
        assert msg is not None
        assert msg.value == "poison"
        assert await msg.nack(dead_letter=True)
        [letter] = await q.dead_letters()
        assert (letter.value, letter.reason) == ("poison", "nacked")
        assert await q.requeue_dead_letters() == 1
        again = await q.receive(30, timeout=5)
        assert again is not None
        assert again.value == "poison"
        assert await again.ack()
        assert await q.purge_dead_letters() == 0


async def test_reliable_consumption_on_a_cluster(cluster: ThrowawayCluster, cluster_clients: Clients) -> None:
    rc = cluster_clients(cluster)
    q: DelayedQueue[int] = DelayedQueue(rc, _name("reliable"))
    await q.offer_many([(i, 0.05) for i in range(50)])
    seen: list[int] = []
    async with q:
        while len(seen) < 50:
            batch = await q.receive_many(20, 30, timeout=5)
            assert batch, "nothing received within 5 s"
            for m in batch:
                seen.append(m.value)
                assert await m.ack()
    assert sorted(seen) == list(range(50))
    assert await rc.zcard(q.keys.in_flight) == 0


async def test_a_redisson_offer_published_on_the_queue_node_wakes_a_consumer_subscribed_elsewhere(
        cluster: ThrowawayCluster, cluster_clients: Clients) -> None:
    rc = cluster_clients(cluster)
    # A long safety poll: only the notification can deliver the item in time.
    q: DelayedQueue[Any] = DelayedQueue(rc, _name("redisson"), safety_poll_s=60)
    async with q:
        k = q.keys
        seconds, _ = await rc.execute_command("TIME", target_nodes=rc.get_node_from_key(k.destination))
        now_ms = int(seconds) * 1000
        # Redisson's own offer script: PUBLISH from Lua on the queue's primary, broadcast by the cluster.
        await rc.eval(OFFER_CURRENT, 4, k.destination, k.timeout_set, k.delay_list, k.channel,  # type: ignore[misc]
                      now_ms + 1500, os.urandom(8), json.dumps({"from": "java"}))
        assert await asyncio.wait_for(q.take(), 10) == {"from": "java"}


async def test_300_queues_keep_at_most_5_connections_per_node(cluster: ThrowawayCluster,
                                                              cluster_clients: Clients) -> None:
    rc = cluster_clients(cluster)
    queues: list[DelayedQueue[int]] = [DelayedQueue(rc, _name(f"many{i}")) for i in range(300)]
    for i, q in enumerate(queues):
        await q.offer(i, 0.5)
    try:
        await asyncio.gather(*(q.open() for q in queues))
        got = await asyncio.wait_for(asyncio.gather(*(q.take() for q in queues)), 30)
        assert sorted(got) == list(range(300))
        ours = {}
        for node in cluster.primaries():
            lines = _cmd(node.port, "CLIENT", "LIST").decode().splitlines()
            # Not counted: the replicas' replication links (flag S) and this CLIENT LIST itself.
            ours[node.port] = sum(1 for line in lines if " flags=S " not in line and "cmd=client" not in line)
        assert max(ours.values()) <= 5, ours
        assert sum(ours.values()) >= 3  # every node served some of it
    finally:
        await asyncio.gather(*(q.aclose() for q in queues))


async def test_a_slot_migration_under_load_loses_and_doubles_nothing(own_cluster: Callable[..., ThrowawayCluster],
                                                                     cluster_clients: Clients,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    cl = own_cluster()
    rc = cluster_clients(cl)
    q: DelayedQueue[int] = DelayedQueue(rc, _name("migrate"))
    # Fill the slot with all kinds of keys of the queue, so the migration takes a few steps.
    await q.offer(-1, 3600, key="stays-pending")
    await rc.rpush(q.keys.dead_letter, b"old")  # type: ignore[misc]
    slot = cl.slot_of(q.keys.destination)
    source = cl.primary_of_slot(slot)
    target = next(n for n in cl.primaries() if n.port != source.port)
    caplog.set_level(logging.DEBUG, logger="aiodelayq")
    async with q:
        offered, got, moved = await migrate_under_load(q, lambda: cl.migrate_slot(slot, target, pause_s=0.2),
                                                       warm=20, pause_s=0.005)
    assert moved >= 4, "the queue's keys should move one by one"
    assert cl.primary_of(q.keys.destination).port == target.port
    assert sorted(got) == offered, (len(got), len(offered))
    assert (await q.get("stays-pending")) is not None
    met = _redirections(caplog)
    assert met["MOVED"] + met["ASK"] + met["TRYAGAIN"] > 0, f"no redirection met: {met}"


def _redirections(caplog: pytest.LogCaptureFixture) -> collections.Counter[str]:
    """The cluster answers the library's calls met and went again for, by answer (its DEBUG log)."""
    return collections.Counter(r.args[0] for r in caplog.records
                               if r.msg == "cluster answered %s for slot %s; sending again")


async def test_a_call_asked_to_a_node_without_its_script_loads_it_there(cluster: ThrowawayCluster,
                                                                         cluster_clients: Clients,
                                                                         caplog: pytest.LogCaptureFixture) -> None:
    rc = cluster_clients(cluster)
    q: DelayedQueue[Any] = DelayedQueue(rc, _name("ask"))
    await q.offer("v", 3600, key="k")
    # GET declares the grouped zset too: with one there, every key it names moves (a migrating slot
    # answers a script whose keys are not all on one node with TRYAGAIN, until the migration ends).
    await q.offer("w", 3600, key="kg", group="g")
    slot = cluster.slot_of(q.keys.destination)
    source = cluster.primary_of_slot(slot)
    target = next(n for n in cluster.primaries() if n.port != source.port)
    caplog.set_level(logging.DEBUG, logger="aiodelayq")
    # Every key moved, the slot still migrating: the source answers ASK; the target has never seen
    # the GET script, so it answers NOSCRIPT, and the script must be loaded there, not on the source.
    moved = await asyncio.to_thread(cluster.migrate_slot, slot, target, finish=False)
    try:
        _cmd(target.port, "SCRIPT", "FLUSH")
        assert moved >= 2
        pending = await q.get("k")
        assert pending is not None
        assert pending.value == "v"
        assert _redirections(caplog)["ASK"] >= 2
    finally:
        await asyncio.to_thread(cluster.finish_migration, slot, target)
    assert (await q.get("k")) is not None  # MOVED now, to the new owner


async def test_a_killed_primary_loses_no_confirmed_offer_and_no_reliable_message(
        own_cluster: Callable[..., ThrowawayCluster], cluster_clients: Clients, redis_server: Any) -> None:
    # Two replicas per primary: after the failover the promoted one still has a replica, so durable
    # writes go on without the dead node.
    cl = own_cluster(replicas=2, extra_args=debug_args(redis_server.kind))
    rc = cluster_clients(cl)
    q: DelayedQueue[int] = DelayedQueue(rc, _name("failover"), min_replicas=1, replication_timeout_s=1.0,
                                        call_timeout_s=10.0)
    primary = cl.primary_of(q.keys.destination)
    async with q, FailoverLoad(q) as load:
        # Offers the dying primary took after its replicas were cut off never reach a replica.
        # Without WAIT they would be confirmed and lost; with it they wait, fail with the primary,
        # are resent and land on the new one.
        print("\n" + await load.kill_unreplicated_primary(cl, primary, warm=25, label="cluster"))
    assert load.lost == [], f"{len(load.lost)} confirmed offers lost: {load.lost[:20]}"
    assert len(load.confirmed) >= 50
    assert cl.primary_of(q.keys.destination).port != primary.port
