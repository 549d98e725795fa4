"""The life of a queue object: what needs it open, concurrent opens and closes, the bound on a close
when the server stops answering, forced shutdowns that never closed it, the event loop it belongs
to, and many queues sharing one client (one transfer task per queue, one pub/sub connection, few others)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import logging
import os
import signal
import sys
import weakref
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from aiodelayq import (
    BackendError,
    DelayedQueue,
    QueueClosedError,
    QueueKeys,
    QueueNotOpenError,
    WrongEventLoopError,
)
from aiodelayq._runtime.client_runtime import TRANSFER_SLOTS, runtime_for
from tests.helpers import free_socket, handoff_payloads, receivers_waiting, takers_waiting, until

# -- opening and closing ---------------------------------------------------------------------------


async def test_take_needs_an_open_queue_and_fails_after_close_instead_of_hanging(client: Redis,
                                                                                  make_queue: Any) -> None:
    q = make_queue()
    with pytest.raises(QueueNotOpenError):
        await q.take()
    with pytest.raises(QueueNotOpenError):
        await q.poll()
    with pytest.raises(QueueNotOpenError):
        q.__aiter__()
    await client.rpush(q.keys.destination, b"{undecodable")
    async with q:
        pump = q._life.pump()
    # Closed: every call fails at once, the pump a caller still holds too, with an item in the list.
    with pytest.raises(QueueClosedError):
        await asyncio.wait_for(pump.get(None), 2)
    with pytest.raises(QueueClosedError):
        await asyncio.wait_for(q.take(), 2)
    with pytest.raises(QueueClosedError):
        await q.open()


async def test_concurrent_opens_share_one_opening_and_cancelling_one_leaves_the_others(make_queue: Any) -> None:
    q = make_queue()
    await asyncio.gather(q.open(), q.open(), q.open())
    assert q.is_open
    other = make_queue()
    first, second = asyncio.create_task(other.open()), asyncio.create_task(other.open())
    await asyncio.sleep(0)
    first.cancel()
    assert await asyncio.wait_for(second, 10) is other
    assert other.is_open
    with pytest.raises(asyncio.CancelledError):
        await first


async def test_aclose_while_opening_leaves_nothing_running(client: Redis, make_queue: Any) -> None:
    q = make_queue()
    opening = asyncio.create_task(q.open())
    await asyncio.sleep(0)
    await q.aclose()
    with pytest.raises(QueueClosedError):
        await opening
    assert not q.is_open
    assert runtime_for(client) is None


async def test_a_cancelled_aclose_still_closes_everything(client: Redis, make_queue: Any) -> None:
    q = make_queue()
    await q.open()
    closing = asyncio.create_task(q.aclose())
    await asyncio.sleep(0)
    closing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await closing
    await q.aclose()  # waits for the close that the cancelled caller started
    assert not q.is_open
    assert runtime_for(client) is None


def _library_tasks() -> set[str]:
    """The names of the library's background tasks still running in this loop."""
    return {t.get_name() for t in asyncio.all_tasks() if t.get_name().startswith("aiodelayq-") and not t.done()}


async def test_closing_a_used_queue_leaves_none_of_its_tasks_running(client: Redis, make_queue: Any) -> None:
    q = make_queue()
    await q.open()
    await q.offer_many([(i, 0) for i in range(40)])
    assert await q.take_many(5) == [0, 1, 2, 3, 4]
    messages = await q.receive_many(10, visibility_timeout=5)  # prefetched messages wait in a buffer
    assert await messages[0].ack(confirm=True)
    assert await messages[1].nack(delay=30)
    assert await messages[2].ack()  # written behind
    receiving = asyncio.create_task(q.receive(visibility_timeout=5, timeout=5))
    await asyncio.sleep(0)
    receiving.cancel()  # undone by its call id
    with contextlib.suppress(asyncio.CancelledError):
        await receiving
    assert _library_tasks()  # the pump, the transfer task, the subscriber...
    await q.aclose()
    assert _library_tasks() == set()
    assert runtime_for(client) is None


async def test_a_task_owner_delivers_a_swallowed_cancellation_again_within_its_deadline() -> None:
    # redis-py can swallow a cancellation that lands inside a command: the owner cancels again.
    from aiodelayq._util.tasks import TaskOwner

    swallowed = 0

    async def stubborn() -> None:
        nonlocal swallowed
        while True:
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                swallowed += 1
                if swallowed == 3:
                    raise

    async def forever() -> None:
        await asyncio.Event().wait()

    owner = TaskOwner("a test")
    tasks = [owner.spawn(stubborn(), name="stubborn"), owner.spawn(forever(), name="forever")]
    await asyncio.sleep(0)
    loop = asyncio.get_running_loop()
    assert await owner.aclose(loop.time() + 5.0)
    assert swallowed == 3
    assert all(t.cancelled() for t in tasks)
    assert len(owner) == 0
    assert await owner.aclose(loop.time())  # idempotent


async def test_a_task_owner_stops_its_tasks_even_when_its_close_is_cancelled(
        caplog: pytest.LogCaptureFixture) -> None:
    from aiodelayq._util.tasks import TaskOwner

    released = False

    async def never_stops() -> None:
        while not released:
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.sleep(10)

    async def cleans_up() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            await asyncio.sleep(0.2)  # bounded cleanup that must not be cut short

    owner = TaskOwner("a test")
    cleaning = owner.spawn(cleans_up(), name="cleans-up")
    stuck = owner.spawn(never_stops(), name="never-stops")
    await asyncio.sleep(0)
    loop = asyncio.get_running_loop()
    closing = asyncio.create_task(owner.aclose(loop.time() + 1.0))
    await asyncio.sleep(0.05)
    closing.cancel()  # a forced shutdown: the stop goes on to its deadline, then the cancellation is raised
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(closing, 5.0)
    assert cleaning.cancelled()  # its cleanup ran to the end first
    assert not stuck.done()  # it holds off every cancellation: reported, not waited for beyond the deadline
    assert "did not stop by the close deadline: never-stops" in caplog.text
    released = True
    stuck.cancel()
    await asyncio.wait({stuck})


async def test_open_racing_the_last_close_shares_one_runtime(client: Redis, make_queue: Any, qname: str) -> None:
    for _ in range(20):
        a, b = make_queue(), make_queue()
        await a.open()
        await asyncio.gather(a.aclose(), b.open())
        runtime = runtime_for(client)
        assert runtime is not None
        assert runtime.transfer_task(qname) is not None
        c = make_queue()
        await c.open()
        assert runtime_for(client) is runtime
        await asyncio.gather(b.aclose(), c.aclose())
        assert runtime_for(client) is None


@pytest.mark.waits
async def test_open_fails_clearly_when_redis_is_unreachable() -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    client = Redis(host="127.0.0.1", port=port, socket_connect_timeout=0.2)
    q = DelayedQueue(client, "nowhere", open_timeout_s=1)
    loop = asyncio.get_running_loop()
    start = loop.time()
    with pytest.raises(BackendError):
        await q.open()
    assert loop.time() - start < 5.0  # does not hang: 5x open_timeout_s (1 s)
    assert not q.is_open
    assert runtime_for(client) is None
    with pytest.raises(BackendError):
        await q.offer("x", 1)
    await q.aclose()
    await client.aclose()


async def test_open_fails_at_once_with_the_reason_when_the_connection_is_refused(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="aiodelayq")
    with free_socket() as bound:  # bound, not listening: every connection is refused
        port = bound.getsockname()[1]
        client = Redis(host="127.0.0.1", port=port, retry=Retry(NoBackoff(), 0))
        q = DelayedQueue(client, "nowhere", open_timeout_s=30)
        with pytest.raises(BackendError) as opened:
            await asyncio.wait_for(q.open(), 10)  # at once, not after open_timeout_s
        await q.aclose()
        await client.aclose()
    assert str(opened.value).startswith("opening 'nowhere' failed at once: the server refused the connection")
    assert f"127.0.0.1:{port}" in str(opened.value)
    assert runtime_for(client) is None
    assert [r.getMessage() for r in caplog.records
            if r.name == "aiodelayq" and r.levelno >= logging.WARNING and "eviction policy" not in r.getMessage()] == []


async def test_open_fails_at_once_with_the_reason_when_the_database_index_is_out_of_range(own_server: Any) -> None:
    server = own_server(databases="1")
    client = Redis.from_url(f"redis://127.0.0.1:{server.port}/5")
    q = DelayedQueue(client, "orders", open_timeout_s=30)
    with pytest.raises(BackendError) as opened:
        await asyncio.wait_for(q.open(), 10)  # at once, not after open_timeout_s
    await q.aclose()
    await client.aclose()
    assert str(opened.value) == ("opening 'orders' failed at once: the server refused the connection's setup: "
                                 "DB index is out of range")


async def test_an_open_that_gets_no_answer_names_what_it_waited_for_and_no_background_task_logs_it(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="aiodelayq")
    with free_socket() as bound:
        bound.listen()  # connections are accepted (by the kernel) and never answered: every call times out
        port = bound.getsockname()[1]
        # No retry inside redis-py: the subscriber and the transfer task fail and try again many times.
        client = Redis(host="127.0.0.1", port=port, socket_connect_timeout=0.2, retry=Retry(NoBackoff(), 0))
        q = DelayedQueue(client, "nowhere", open_timeout_s=2, call_timeout_s=0.5)
        with pytest.raises(BackendError) as opened:
            await q.open()
        await q.aclose()
        await client.aclose()
    assert q.keys.channel in str(opened.value)  # what it waited for: the subscription
    failures = [r for r in caplog.records if r.name == "aiodelayq" and "failed" in r.getMessage()]
    assert failures  # the background tasks did fail meanwhile: at DEBUG, the caller got the error
    assert [r.getMessage() for r in caplog.records if r.name == "aiodelayq" and r.levelno >= logging.WARNING] == []


async def test_aclose_wakes_waiting_takes_and_receives_is_idempotent_and_bounded(make_queue: Any) -> None:
    q = make_queue(close_timeout_s=2)
    await q.open()
    takers = [asyncio.create_task(q.take()) for _ in range(3)]
    receiver = asyncio.create_task(q.receive(visibility_timeout=30))
    await until(lambda: takers_waiting(q) == 3 and receivers_waiting(q) == 1)
    loop = asyncio.get_running_loop()
    start = loop.time()
    await asyncio.gather(q.aclose(), q.aclose())
    # Does not hang: a close waits for nothing here, and close_timeout_s (2 s) bounds it anyway.
    assert loop.time() - start < 2.5
    for waiter in [*takers, receiver]:
        with pytest.raises(QueueClosedError):
            await asyncio.wait_for(waiter, 3)
    await q.aclose()
    assert not q.is_open


async def test_aclose_keeps_its_bound_while_the_server_is_stopped_and_another_queue_opens(
        own_server: Any, make_client: Any, make_queue: Any) -> None:
    server = own_server()
    client = make_client(server, socket_timeout=None)  # redis-py alone would wait forever
    a = make_queue("a", redis=client, close_timeout_s=1.0, call_timeout_s=5.0)
    b = make_queue("b", redis=client, open_timeout_s=30.0)
    await a.open()
    taker = asyncio.create_task(a.take())
    await until(lambda: takers_waiting(a) == 1)
    runtime = runtime_for(client)
    assert runtime is not None
    os.kill(server.pid, signal.SIGSTOP)  # it answers nothing until SIGCONT
    try:
        opening = asyncio.create_task(b.open())  # on the same client, stuck on the stopped server
        await until(lambda: b.name in runtime.entries)
        loop = asyncio.get_running_loop()
        start = loop.time()
        await a.aclose()
        # Does not hang: close_timeout_s (1 s) bounds the close; the stopped server never answers.
        assert loop.time() - start < 5.0
        with pytest.raises(QueueClosedError):
            await taker
        assert not opening.done()
    finally:  # before the fixtures close the queues, the client and the server
        os.kill(server.pid, signal.SIGCONT)
    await asyncio.wait_for(opening, 15)
    assert b.is_open


# -- a forced shutdown: the event loop ends without closing the queue ------------------------------------

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
    # Does not hang: 5x the 0.5 s the library may flush for (a hang waits out the 5 s call timeout or more).
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
        in_handoff += len(handoff_payloads(blob))
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


# -- the event loop a queue belongs to, and what it keeps alive -------------------------------------


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


async def test_clients_handed_to_queues_can_be_garbage_collected(single_server: Any, qname: str,
                                                                  drop_keys: Any) -> None:
    for i in range(3):
        drop_keys(*QueueKeys.for_name(f"{qname}:{i}").all)
    refs = []
    before = asyncio.all_tasks()
    for i in range(50):
        c = Redis.from_url(single_server.url)  # not make_client: the factory would keep it alive
        q = DelayedQueue(c, f"{qname}:{i % 3}")
        await q.offer(i, 3600)
        if i % 5 == 0:
            async with q:
                pass
        await c.aclose()
        refs.append(weakref.ref(c))
        del c, q
    # A task the calls started may still be finishing its last step (it holds its queue, and so its
    # client, until then): what must not outlive them is a reference from anything still running.
    await until(lambda: not (asyncio.all_tasks() - before - {asyncio.current_task()}))
    await asyncio.sleep(0)  # their done callbacks
    gc.collect()
    alive = [r() for r in refs if r() is not None]
    assert alive == [], [type(holder).__name__ for holder in gc.get_referrers(*alive)]


# -- many queues on one client ---------------------------------------------------------------------------


async def test_one_scheduler_and_one_pubsub_connection_per_client(client: Redis, make_queue: Any,
                                                                  qname: str) -> None:
    name = await client.client_getname()
    assert name is None
    queues = [make_queue(f"{qname}:{i}") for i in range(5)] + [make_queue(f"{qname}:0")]
    for q in queues:
        await q.open()
    runtime = runtime_for(client)
    assert runtime.subscriber.channels == 5
    assert runtime.transfer_task(f"{qname}:0") is runtime.transfer_task(queues[-1].name)
    mine = [c for c in await client.client_list(_type="pubsub")
            if int(c.get("sub", 0)) == 5]
    assert len(mine) == 1
    await queues[-1].aclose()
    assert runtime.transfer_task(f"{qname}:0") is not None  # still used by queues[0]


async def test_many_idle_queues_share_one_pubsub_and_few_connections(qname: str, make_client: Any,
                                                                     make_queue: Any, single_server: Any) -> None:
    client = make_client(max_connections=40)
    queues = [make_queue(f"{qname}:{i}", redis=client, safety_poll_s=0.5) for i in range(300)]
    await asyncio.gather(*(q.open() for q in queues))
    runtime = runtime_for(client)
    assert runtime is not None
    assert runtime.safety_poll is not None
    # Three safety-poll rounds of 300 queues (two pipelined reads each; 0.5 s apart, a slow machine
    # takes longer per round).
    await until(lambda: runtime.safety_poll.polls >= 6, timeout_s=15)
    assert sum(q.stats.transfer_errors for q in queues) == 0  # the pool (40) was never exhausted
    assert runtime.subscriber.channels == 300
    pool = client.connection_pool
    # The client's background calls share TRANSFER_SLOTS connections; + pub/sub + the eviction check's.
    assert len(pool._available_connections) + len(pool._in_use_connections) <= TRANSFER_SLOTS + 2


async def test_two_thousand_consumed_queues_keep_the_client_to_a_few_connections(
        qname: str, client: Redis, make_client: Any, make_queue: Any, single_server: Any) -> None:
    consumer = make_client(max_connections=100, client_name="adq-many")
    queues: list[DelayedQueue[int]] = [make_queue(f"{qname}:{i}", redis=consumer) for i in range(2000)]
    for start in range(0, 2000, 500):
        await asyncio.gather(*(q.open() for q in queues[start:start + 500]))
    takers = [asyncio.create_task(q.take()) for q in queues]
    try:
        await until(lambda: all(takers_waiting(q) == 1 for q in queues), timeout_s=30)
        producer = make_queue(f"{qname}:7", redis=consumer)
        await producer.offer(7, 0)
        assert await asyncio.wait_for(takers[7], 10) == 7
        clients = [c for c in await client.client_list() if c.get("name") == "adq-many"]
        assert len(clients) <= 12, len(clients)
        assert sum(q.stats.transfer_errors for q in queues) == 0
    finally:
        for t in takers:  # before the queues close (after the test): no taker is left failing unseen
            t.cancel()


async def test_closing_2000_queues_at_once_ends_quietly_and_loses_nothing(
        qname: str, client: Redis, make_client: Any, make_queue: Any, caplog: pytest.LogCaptureFixture) -> None:
    shared = make_client()  # redis-py's default pool: 100 connections
    queues = [make_queue(f"{qname}:{i}", redis=shared) for i in range(2000)]
    consumed = queues[:100]
    await asyncio.gather(*(q.open() for q in queues))
    await asyncio.gather(*(q.offer_many([(i, 0) for i in range(20)]) for q in consumed))
    taken: dict[str, list[int]] = {q.name: [] for q in consumed}

    async def consume(q: DelayedQueue[int]) -> None:
        with contextlib.suppress(QueueClosedError):
            while True:
                taken[q.name].append(await q.take())
                await asyncio.sleep(0.05)  # slower than delivery: pumps hold prefetched items at the close

    takers = [asyncio.create_task(consume(q)) for q in consumed]
    await until(lambda: sum(map(len, taken.values())) >= 300, timeout_s=30)
    loop = asyncio.get_running_loop()
    with caplog.at_level(logging.WARNING, logger="aiodelayq"):
        started = loop.time()
        await asyncio.wait_for(asyncio.gather(*(q.aclose() for q in queues)), 60)
        elapsed = loop.time() - started
        await asyncio.wait_for(asyncio.gather(*takers), 10)  # each ends with QueueClosedError
    # Does not hang: a few seconds here (the time itself is measured by the benchmarks' idle scenario).
    assert elapsed < 15
    assert [r.getMessage() for r in caplog.records if r.name == "aiodelayq"] == []
    assert runtime_for(shared) is None
    # Nothing lost, nothing doubled: what was taken and what is back in the list is every item once.
    for q in consumed:
        back = [json.loads(raw) for raw in await client.lrange(q.keys.destination, 0, -1)]
        assert sorted(taken[q.name] + back) == list(range(20)), q.name
        # Every pop was settled by the close; a pop cut off in flight leaves an empty tombstone (so
        # that it pops nothing should it still arrive), cleared when its lease ends.
        assert set((await client.hgetall(q.keys.handoff)).values()) <= {b""}


# A program whose coroutine is busy in Python code (a lock, arithmetic) and sends itself SIGINT from
# there. Python 3.10's asyncio.run leaves SIGINT to the default handler, which raises
# KeyboardInterrupt inside the coroutine right after os.kill: "cancelled" is never printed. The CLI's
# runner (asyncio.run's behaviour from 3.11 on) cancels the coroutine at its next await instead, lets
# it unwind, then raises KeyboardInterrupt.
_SELF_INTERRUPTED = """
import asyncio, os, signal
from aiodelayq._util.tasks import run_interruptible

async def work():
    lock = asyncio.Lock()
    try:
        for n in range(1_000_000):
            async with lock:
                if n == 100:
                    os.kill(os.getpid(), signal.SIGINT)
                sum(range(100))
            await asyncio.sleep(0)
    except asyncio.CancelledError:
        print("cancelled", flush=True)
        raise

try:
    run_interruptible(work())
except KeyboardInterrupt:
    print("interrupted", flush=True)
"""


async def test_ctrl_c_cancels_the_work_then_interrupts_on_every_python() -> None:
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", _SELF_INTERRUPTED, stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert (proc.returncode, out.decode(), err.decode()) == (0, "cancelled\ninterrupted\n", "")


_SELF_TERMINATED = """
import asyncio, os, signal
from aiodelayq._util.tasks import cancel_on_signal, run_interruptible

terminated = []

async def work():
    try:
        await asyncio.sleep(0.05)
        os.kill(os.getpid(), signal.SIGTERM)
        await asyncio.sleep(60)
    except asyncio.CancelledError:
        print("cancelled", flush=True)
        raise

try:
    run_interruptible(cancel_on_signal(work(), signal.SIGTERM, lambda: terminated.append(True)))
except asyncio.CancelledError:
    print("terminated" if terminated else "cancelled by something else", flush=True)
"""


async def test_sigterm_cancels_the_work_inside_the_ctrl_c_runner_on_every_python() -> None:
    # The command line's watch: SIGTERM unwinds the work as Ctrl-C does, inside the runner above.
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", _SELF_TERMINATED, stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert (proc.returncode, out.decode(), err.decode()) == (0, "cancelled\nterminated\n", "")
