"""Durable writes: with ``min_replicas``, a write returns only once that many replicas have
it, checked by reading the replica right after the call returns (acks included, a worker's too); an
unconfirmed one raises ``NotReplicatedError`` and is neither undone nor doubled; a resend after a lost
reply is covered too."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from typing import Any

import pytest
from redis.asyncio import Redis

from aiodelayq import ConfigurationError, DelayedQueue, NotReplicatedError, current_message
from aiodelayq._redis.connections import run_script
from aiodelayq._scripts import QueueScripts
from aiodelayq._wire.item_keys import key_tag
from aiodelayq.testing import ThrowawayServer, server_version
from aiodelayq.testing.topologies import replicate
from tests.faults import debug_args, stall_server
from tests.helpers import until

pytestmark = pytest.mark.topology


def _replicated(own_server: Callable[..., ThrowawayServer], replicas: int = 1,
                **options: str) -> tuple[ThrowawayServer, list[ThrowawayServer]]:
    primary = own_server(**options)
    followers = [own_server(**options) for _ in range(replicas)]
    replicate(primary, followers)
    return primary, followers


async def test_a_durable_offer_returns_only_once_the_replica_has_it(own_server: Any, make_client: Any,
                                                                    make_queue: Any, redis_server: Any) -> None:
    primary, [replica] = _replicated(own_server, **debug_args(redis_server.kind))
    q: DelayedQueue[int] = make_queue(redis=make_client(primary), min_replicas=1, replication_timeout_s=5)
    reader: Redis = make_client(replica)
    for i in range(30):
        await q.offer(i, 60)
        # Read on the replica right after the return: WAIT said it has it.
        assert await reader.zcard(q.keys.timeout_set) == i + 1
    # A replica that does not answer for 1 s holds the offer back that long (without min_replicas
    # it returns in a round trip).
    loop = asyncio.get_running_loop()
    stall = stall_server(replica.url, 1.0)
    start = loop.time()
    await q.offer(30, 60)
    assert loop.time() - start >= 0.7
    stall.result(5)
    assert await reader.zcard(q.keys.timeout_set) == 31
    assert await q.cancel("absent") is False
    await q.offer(100, 60, key="k")
    assert await reader.zcard(q.keys.timeout_set) == 32
    assert await q.cancel("k")
    assert await reader.zcard(q.keys.timeout_set) == 31


async def test_durable_receive_and_ack_reach_the_replica_before_they_return(own_server: Any, make_client: Any,
                                                                            make_queue: Any) -> None:
    primary, [replica] = _replicated(own_server)
    q: DelayedQueue[int] = make_queue(redis=make_client(primary), min_replicas=1, replication_timeout_s=5)
    reader: Redis = make_client(replica)
    await q.offer_many([(i, 0) for i in range(25)])
    async with q:
        msg = await q.receive(30, timeout=5)
        assert msg is not None
        assert await reader.zcard(q.keys.in_flight) == 1
        # A plain ack(), the queue's default: confirmed, as every durable write.
        assert await msg.ack()
        assert await reader.zscore(q.keys.in_flight, msg._element) is None
        msgs = await q.receive_many(24, 30, timeout=5)
        while len(msgs) < 24:
            msgs += await q.receive_many(24 - len(msgs), 30, timeout=5)
        for one in msgs[:4]:  # one by one: each on the replica when its ack returns
            assert await one.ack()
            assert await reader.zscore(q.keys.in_flight, one._element) is None
        # Concurrent acks share SETTLE calls; each returns once the replica has it.
        rest = msgs[4:]
        assert all(await asyncio.gather(*(m.ack() for m in rest)))
        scores = await reader.zmscore(q.keys.in_flight, [m._element for m in rest])
        assert scores == [None] * len(rest)
        assert await reader.zcard(q.keys.in_flight) == 0
        assert not await msg.ack()  # settled already
    assert q.stats.unconfirmed_settles == 0


async def test_an_unconfirmed_ack_raises_and_is_applied_on_the_primary(own_server: Any, make_client: Any,
                                                                       make_queue: Any) -> None:
    primary, [replica] = _replicated(own_server)
    client: Redis = make_client(primary)
    q: DelayedQueue[int] = make_queue(redis=client, min_replicas=1, replication_timeout_s=0.2, call_timeout_s=1)
    await q.offer_many([(1, 0), (2, 0)])
    async with q:
        msgs = await q.receive_many(2, 30, timeout=5)
        while len(msgs) < 2:
            msgs += await q.receive_many(2 - len(msgs), 30, timeout=5)
        confirmed, behind = msgs
        replica.stop()  # nothing confirms from now on
        with pytest.raises(NotReplicatedError) as caught:
            await asyncio.wait_for(confirmed.ack(), 10)  # WAIT gives up after 0.2 s
        assert (caught.value.replicas, caught.value.wanted, caught.value.maybe_applied) == (0, 1, True)
        assert "applied on the primary" in str(caught.value)
        assert await client.zscore(q.keys.in_flight, confirmed._element) is None  # applied, not undone
        # Written behind on request: True at once; the settle call's failed confirmation is counted.
        assert await behind.ack(confirm=False)
        assert behind.settled
        await until(lambda: q.stats.unconfirmed_settles == 1, timeout_s=10)
        assert await client.zscore(q.keys.in_flight, behind._element) is None


async def test_a_durable_worker_acks_confirmed(own_server: Any, make_client: Any, make_queue: Any,
                                               caplog: pytest.LogCaptureFixture) -> None:
    primary, [replica] = _replicated(own_server)
    q: DelayedQueue[int] = make_queue(redis=make_client(primary), min_replicas=1, replication_timeout_s=5)
    reader: Redis = make_client(replica)
    n = 20
    await q.offer_many([(i, 0) for i in range(n)])
    previous: list[bytes] = []
    acked_before_next: list[bool] = []

    async def handler(item: int) -> None:
        # One slot: the previous handler's ack returned before this one started, so the replica has it.
        if previous:
            acked_before_next.append(await reader.zscore(q.keys.in_flight, previous[-1]) is None)
        message = current_message()
        assert message is not None
        previous.append(message._element)

    async with q:
        worker = q.worker(handler, concurrency=1, visibility_timeout_s=30)
        task = asyncio.create_task(worker.run())
        await until(lambda: len(previous) == n, timeout_s=20)
        worker.stop()
        await asyncio.wait_for(task, 10)
        # The slot waited for the last ack too: on the replica once the worker stopped.
        assert await reader.zcard(q.keys.in_flight) == 0
    assert acked_before_next == [True] * (n - 1)
    assert worker.stats.succeeded == n
    assert q.stats.unconfirmed_settles == 0

    # Without the replica, the worker's ack is applied on the primary and reported as unconfirmed.
    q2: DelayedQueue[int] = make_queue(f"{q.name}:2", redis=make_client(primary), min_replicas=1,
                                       replication_timeout_s=0.2, call_timeout_s=1)
    await q2.offer(99, 0)
    handled = asyncio.Event()

    async def stops_the_replica(item: int) -> None:
        await asyncio.to_thread(replica.stop)
        handled.set()

    caplog.set_level(logging.WARNING, logger="aiodelayq")
    async with q2:
        worker2 = q2.worker(stops_the_replica, concurrency=1, visibility_timeout_s=30)
        task = asyncio.create_task(worker2.run())
        await asyncio.wait_for(handled.wait(), 10)
        await until(lambda: any("not confirmed by the replicas" in r.getMessage() for r in caplog.records),
                    timeout_s=10)
        worker2.stop()
        await asyncio.wait_for(task, 10)
    assert await make_client(primary).zcard(q2.keys.in_flight) == 0  # applied on the primary
    assert q2.stats.unconfirmed_settles == 0  # confirmed settles raise to their caller: not written behind


async def test_an_unconfirmed_write_raises_and_is_neither_undone_nor_doubled(own_server: Any, make_client: Any,
                                                                             make_queue: Any) -> None:
    primary, _ = _replicated(own_server)
    client = make_client(primary)
    q: DelayedQueue[int] = make_queue(redis=client, min_replicas=2, replication_timeout_s=0.05, call_timeout_s=0.5)
    with pytest.raises(NotReplicatedError) as caught:
        await q.offer(1, 60)
    assert (caught.value.replicas, caught.value.wanted, caught.value.maybe_applied) == (1, 2, True)
    assert "1 of 2 replicas" in str(caught.value)
    assert await client.zcard(q.keys.timeout_set) == 1  # not undone
    # Not resent: one WAIT for the write (and the client's one-time WAIT 0 0 check before it).
    stats = await client.info("commandstats")
    assert stats["cmdstat_wait"]["calls"] == 2


async def test_a_deduplicated_resend_writes_so_its_wait_covers_the_first_run(own_server: Any,
                                                                           make_client: Any, qname: str) -> None:
    primary, _ = _replicated(own_server)
    client: Redis = make_client(primary)
    await client.config_set("repl-ping-replica-period", 3600)  # no PING grows the offset meanwhile
    q: DelayedQueue[int] = DelayedQueue(client, qname)
    k = q.keys
    await q.offer(1, 60, key="k")
    raw = b"k"
    keys = [getattr(k, name) for name in QueueScripts.cancel.key_names]
    args = [os.urandom(16), raw, key_tag(raw)]
    assert int(await run_script(client, QueueScripts.cancel, keys, args, timeout_s=5)) == 1
    offset = int((await client.info("replication"))["master_repl_offset"])
    # The same call again, as a resend after a lost reply: the remembered answer, not a second run...
    assert int(await run_script(client, QueueScripts.cancel, keys, args, timeout_s=5)) == 1
    # ...and yet a write (its call id again), so a WAIT on the resend's connection covers the first run.
    assert int((await client.info("replication"))["master_repl_offset"]) > offset


async def test_wait_aof_confirms_the_fsync_where_the_server_has_it(own_server: Any, make_client: Any,
                                                                   make_queue: Any) -> None:
    primary, [replica] = _replicated(own_server, appendonly="yes", appendfsync="everysec")
    version = tuple(int(x) for x in server_version(primary.kind.binary).split(".")[:2])
    if version < (7, 2):
        pytest.skip(f"WAITAOF needs Redis/Valkey >= 7.2 ({primary.kind.name} is {version})")
    q: DelayedQueue[int] = make_queue(redis=make_client(primary), min_replicas=1, wait_aof=True)
    await q.offer(1, 60)
    assert await make_client(replica).zcard(q.keys.timeout_set) == 1
    plain = own_server()  # appendonly no: WAITAOF 1 ... can never confirm: refused before writing
    plain_client = make_client(plain)
    q2: DelayedQueue[int] = make_queue(redis=plain_client, wait_aof=True, call_timeout_s=0.3)
    with pytest.raises(ConfigurationError, match="appendonly"):
        await q2.offer(1, 60)
    assert await plain_client.zcard(q2.keys.timeout_set) == 0


@pytest.mark.parametrize(("option", "value"), [("min_replicas", -1), ("min_replicas", 1.5), ("min_replicas", True),
                                               ("replication_timeout_s", 0), ("wait_aof", "yes")])
def test_bad_durability_options_are_refused(client: Redis, option: str, value: Any) -> None:
    with pytest.raises(ConfigurationError, match=option):
        DelayedQueue(client, "x", **{option: value})
